"""Model paths built only from portable_kernels' public ops and plain torch.

`load(path, backend=..., kv_cache=...)` reads a DeepSeek-V3-architecture checkpoint directory
(Hugging Face layout, FP8 block weights) and returns a model with `logits` and `generate`.
"""

from __future__ import annotations

from .deepseek import DeepseekV3, load

__all__ = ["DeepseekV3", "load"]
