"""The ascend backend's providers (torch_npu, per chip)."""
