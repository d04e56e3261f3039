"""The paged latent KV cache: per layer [num_pages, 64, 1, 576] bf16, or FP8 656-byte rows
[num_pages, 64, 1, 656] (512 e4m3 latent values, 4 fp32 power-of-two scales, 64 bf16 RoPE) in the
decode backend's KV-cache Format (`pk.allocate_kv_cache` / `pk.write_kv_cache`: FlashMLA's order on
cpu and nvidia, CANN's on the Ascend 950), so no decode call converts the cache.

One rule: pages are handed out in a seeded random order, so no sequence's pages are contiguous
and a kernel that ignored the block table would read the wrong tokens.
"""

from __future__ import annotations

import math

import torch

import portable_kernels as pk

from ...layouts.indexer_cache import INDEXER_SCALE_BYTES, indexer_cache_views, quantize_indexer_keys

PAGE_SIZE = 64
ENTRY_BF16 = 576
ENTRY_FP8_BYTES = 656
KV_CACHE_KINDS = ("bf16", "fp8")


class PagedLatentCache:
    """One block table for all layers; one page pool per layer."""

    def __init__(self, num_layers: int, capacity: list[int], kind: str = "bf16", seed: int = 0,
                 index_head_dim: int | None = None, backend: str | None = None, options: dict | None = None):
        if kind not in KV_CACHE_KINDS:
            raise ValueError(f"kv_cache is {kind!r}; expected one of {KV_CACHE_KINDS}")
        self.kind = kind
        pages = [math.ceil(max(c, 1) / PAGE_SIZE) for c in capacity]
        total = sum(pages)
        order = torch.randperm(total, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        width = max(pages)
        # Unused table entries point past the pool: a kernel that read them would fail loudly.
        self.block_table = torch.full((len(capacity), width), total + 1000, dtype=torch.int32)
        start = 0
        for b, n in enumerate(pages):
            self.block_table[b, :n] = order[start:start + n]
            start += n
        self.seqlens = torch.zeros(len(capacity), dtype=torch.int32)
        #: tokens each row's pages hold (its capacity rounded up to whole pages)
        self.capacity = torch.tensor(pages, dtype=torch.int32) * PAGE_SIZE
        if kind == "bf16":
            self.pages = [torch.zeros(total, PAGE_SIZE, 1, ENTRY_BF16, dtype=torch.bfloat16) for _ in range(num_layers)]
        else:  # FP8 pages in the decode backend's KV-cache Format (CANN's row order on the 950), written once
            self.pages = [pk.allocate_kv_cache(total, PAGE_SIZE, backend=backend, options=options)
                          for _ in range(num_layers)]
        #: DeepSeek-V3.2: per layer the indexer's FP8 keys, DeepGEMM's paged layout on the same pages
        self.index_pages = [] if index_head_dim is None else [
            torch.zeros(total, PAGE_SIZE, 1, index_head_dim + INDEXER_SCALE_BYTES, dtype=torch.uint8)
            for _ in range(num_layers)]

    @property
    def is_fp8(self) -> bool:
        return self.kind == "fp8"

    def slots(self, batch: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.block_table[batch, positions // PAGE_SIZE].long(), positions % PAGE_SIZE

    def write(self, layer: int, batch: torch.Tensor, positions: torch.Tensor, entries: torch.Tensor) -> None:
        """entries bf16 [T, 576] of tokens at (batch, position)."""
        page, offset = self.slots(batch, positions)
        if self.is_fp8:
            pk.write_kv_cache(self.pages[layer], page, offset, entries.view(-1, ENTRY_BF16).bfloat16())
        else:
            self.pages[layer][page, offset, 0] = entries

    def write_index_keys(self, layer: int, batch: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor) -> None:
        """keys fp32 [T, D] of tokens at (batch, position), quantized per token (layouts.indexer_cache)."""
        page, offset = self.slots(batch, positions)
        values, scales = indexer_cache_views(self.index_pages[layer])
        data, sf = quantize_indexer_keys(keys)
        values[page, offset] = data
        scales[page, offset] = sf

    def cache_slots(self, batch: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """int32 flat slots (page * PAGE_SIZE + offset) of (batch, position); -1 where position is -1."""
        valid = positions >= 0
        page, offset = self.slots(batch, positions.clamp(min=0))
        return torch.where(valid, page * PAGE_SIZE + offset, -1).to(torch.int32)

    @property
    def nbytes(self) -> int:
        tensors = [getattr(p, "data", p) for p in self.pages] + self.index_pages
        return sum(t.numel() * t.element_size() for t in tensors)
