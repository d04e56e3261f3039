"""Quantization contracts: FP8 casts (per token, block, channel) and dequantize, FP4 casts, block casts."""
