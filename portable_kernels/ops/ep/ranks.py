"""How R simulated ranks share one process: their rows concatenated in rank order."""

from __future__ import annotations

from typing import Sequence

import torch


def _rank_offsets(sizes: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(first global row of each rank [R], rank of each global row [sum(sizes)]) for concatenated ranks."""
    counts = torch.tensor(list(sizes), dtype=torch.int64, device=device)
    starts = counts.cumsum(0) - counts
    return starts, torch.repeat_interleave(torch.arange(len(sizes), device=device), counts)
