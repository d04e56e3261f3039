"""One benchmark case: a public op on prepared inputs beside the torch code a user would write instead.

Rule: a case builds its inputs for a device once (`build`), outside the timed region; `op` and
`peer` then take those inputs and do only what a user's hot path would do. The runner calls all
three inside the backend's `use_backend` block, so `build` prepares operands for that backend.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import attrs
import torch

from ...core.contract import get_contract
from ...core.registry import forced_backend, registry

#: the case sets a run may ask for: "tiny" (a smoke test of the machinery: seconds, its times mean
#: nothing), "quick" (DeepSeek shapes, the largest left out) and "full"
Size = Literal["tiny", "quick", "full"]
SIZES: tuple[str, ...] = ("tiny", "quick", "full")
QUICK_AND_FULL = frozenset({"quick", "full"})
FULL_ONLY = frozenset({"full"})
TINY = frozenset({"tiny"})


@attrs.frozen
class Case:
    """A benchmark case of one op family.

    build(device) -> inputs: makes (seeded) inputs on `device` and prepares them for the backend in
        force; may set `inputs.provider` (a str) for a case that calls no registry op, so the report
        can still say what ran.
    op(inputs): the library's public op (or, for the layouts family, the encoder prepare_inputs runs).
    peer(inputs): the torch code a user would write instead, on the same device.
    target: peer time / op time that an issue asks for (None: no target); limit_us: an absolute
        per-call target for the op side in microseconds; target_on: the backends (or, for a family
        that calls none, the device types) the targets were set for (None: every one). A target is
        never judged on a backend in emulation, nor on the tiny set.
    memory: also measure the peak memory growth of one call of each side.
    devices: the device types the case applies to (None: every device), e.g. ("cuda",) for a case
        whose peer is a CUDA-only torch call; elsewhere it is reported as skipped.
    """

    family: str
    name: str
    shape: str
    build: Callable[[torch.device], Any]
    op: Callable[[Any], Any]
    peer: Callable[[Any], Any]
    op_label: str
    peer_label: str
    target: float | None = None
    limit_us: float | None = None
    target_source: str = ""
    target_on: tuple[str, ...] | None = None
    sizes: frozenset[str] = QUICK_AND_FULL
    memory: bool = False
    devices: tuple[str, ...] | None = None

    @property
    def judged(self) -> bool:
        """Whether its target applies: tiny cases test the machinery, at shapes no target was set for."""
        return "tiny" not in self.sizes

    @property
    def label(self) -> str:
        return f"{self.name} {self.shape}"


class Inputs(dict):
    """What a case's build returns: named tensors and values, readable as attributes. Keys the runner
    reads when present: `provider` (what ran, for a case that calls no registry op), `note` (recorded
    with the case, e.g. that UE8M0 scales were used) and `bytes_moved` (for GB/s)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def needs_pow2_scales(op: str) -> bool:
    """Whether the backend in force stores some quantized argument of `op` in a Format that can only
    carry power-of-two (UE8M0) scales: a user of that backend quantizes with use_ue8m0=True."""
    forced = forced_backend()
    if forced is None:
        return False
    name, options = forced
    backend = registry().backend(name)
    contract = get_contract(op)
    return any(backend.format_for(contract.name, arg, options).requires_pow2 for arg in contract.quant_args)


UE8M0_NOTE = "UE8M0 scales: this backend's Format carries only powers of two"


def seeded(*shape: int, seed: int, device: torch.device, dtype: torch.dtype = torch.bfloat16,
           scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn on CPU from a seed (the same numbers on every device), then moved."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale
    return x.to(dtype=dtype, device=device)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
