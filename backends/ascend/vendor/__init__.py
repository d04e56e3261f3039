"""The torch_npu calls each ascend provider makes (one module per op family) and the lazy
torch_npu runtime (import, chip detection, availability)."""
