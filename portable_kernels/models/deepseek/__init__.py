"""DeepSeek-V3 for inference on portable_kernels: config, checkpoint reader/writer, layers, model."""

from __future__ import annotations

from .model import DeepseekV3, load

__all__ = ["DeepseekV3", "load"]
