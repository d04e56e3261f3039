"""The MoE contiguous layout's row alignment (settable, as DeepGEMM's) and its padding rows.

Every expert segment of a contiguous grouped-GEMM operand starts on a multiple of the alignment.
By default that is the backend's own (`Backend.moe_alignment`: 128 on NVIDIA and cpu, 256 on
Ascend); `set_mk_alignment_for_contiguous_layout(n)` sets one value for the whole process (DeepGEMM
sets 224 on SM100 for its block size), and every op that builds or reads the layout — the
contiguous grouped GEMMs, `get_fused_mapping`'s default, `get_m_alignment_for_contiguous_layout` (the
getter, here beside the setter) — then uses it. `padding_rows` finds the rows of either form that belong to no group with device ops
only (no host sync), so an op can zero them after any provider ran.
"""

from __future__ import annotations

import threading

import torch

from .checks import check_int
from .errors import BackendUnavailableError, ContractError, format_problem
from .registry import Backend, forced_backend, registry
from .tensors import PreparedTensor, describe

_lock = threading.Lock()
_override: int | None = None


def set_mk_alignment_for_contiguous_layout(alignment: int | None) -> None:
    """Set the row alignment of every expert segment in the contiguous layout, for the whole process
    (DeepGEMM's function of the same name). None restores each backend's own alignment.

    Build m_indices / psum layouts with the value `get_m_alignment_for_contiguous_layout()` returns
    after this call; the grouped GEMMs read layouts with it and refuse m_indices that do not fit it.
    """
    if alignment is not None:
        check_int("set_mk_alignment_for_contiguous_layout", "alignment", alignment, 1,
                  fix="pass a positive row count such as 128 (DeepGEMM uses 224 on SM100), or None to reset")
    global _override
    with _lock:
        _override = alignment


def alignment_override() -> int | None:
    """The alignment set by set_mk_alignment_for_contiguous_layout, or None (each backend's own)."""
    return _override


def contiguous_alignment(backend: Backend) -> int:
    """The alignment a contiguous layout has on `backend`: the process-wide setting, else its own."""
    override = _override
    return backend.moe_alignment if override is None else override


def get_m_alignment_for_contiguous_layout(device: str | torch.device | None = None, *,
                                          like: PreparedTensor | None = None) -> int:
    """Rows each group's segment is padded to in the contiguous layout, for the backend that runs
    the call: the value set by `set_mk_alignment_for_contiguous_layout` if any, else that of the
    backend forced by `use_backend`, else of the backend a prepared weight `like` was made for,
    else of the one for `device` (default: cpu). NVIDIA (and cpu) 128, Ascend 256 — DeepGEMM's
    function of the same name, per backend."""
    op = "get_m_alignment_for_contiguous_layout"
    override = _override
    if override is not None:
        return override
    reg = registry()
    forced = forced_backend()
    if forced is not None:
        return reg.backend(forced[0]).moe_alignment
    if like is not None:
        if not isinstance(like, PreparedTensor):
            raise ContractError(format_problem(op, "like", describe(like), "None or a PreparedTensor",
                                               "pass the prepared grouped weight (prepare_inputs(...)['b'])"))
        return reg.backend(like.backend).moe_alignment
    try:
        dev = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as exc:
        kind = str(device).split(":")[0]
        for backend in reg.backends().values():  # a device type a backend names, absent from this torch
            if kind in backend.device_types:
                raise BackendUnavailableError(
                    f"{op}: device {device!r} of backend {backend.name!r} is not available here: "
                    f"{backend.unavailable_reason() or 'this torch has no such device type'}. Fix: ask inside "
                    f"use_backend({backend.name!r}) to get its alignment in emulation.") from exc
        raise ContractError(format_problem(op, "device", repr(device), "a torch device such as 'cpu' or 'cuda'",
                                           "pass a valid device, or call inside use_backend(...)")) from exc
    backend = reg.backend_for_device(dev)
    reason = None if dev.type == "cpu" else backend.unavailable_reason()
    if reason is not None:
        raise BackendUnavailableError(f"{op}: backend {backend.name!r} for device {dev} is unavailable: {reason}. "
                                      f"Fix: ask inside use_backend({backend.name!r}) to get its alignment in "
                                      f"emulation.")
    return backend.moe_alignment


#: DeepGEMM's newer name of the same function (it covers the K-grouped layouts too)
get_mk_alignment_for_contiguous_layout = get_m_alignment_for_contiguous_layout


def padding_rows(grouped_layout: torch.Tensor, use_psum_layout: bool, alignment: int, total_m: int) -> torch.Tensor:
    """bool [total_m]: True on rows that belong to no group — m_indices -1, or in the psum form the
    gaps [psum[g-1], align(psum[g-1], alignment)) and every row from psum[-1] on. Device ops only."""
    if not use_psum_layout:
        return grouped_layout < 0
    ends = grouped_layout.to(torch.int64)
    if ends.numel() == 0:
        return torch.ones(total_m, dtype=torch.bool, device=grouped_layout.device)
    previous = torch.cat((ends.new_zeros(1), ends[:-1]))
    starts = (previous + alignment - 1) // alignment * alignment
    rows = torch.arange(total_m, device=grouped_layout.device)
    group = torch.searchsorted(ends, rows, right=True)   # the first group whose end lies past the row
    inside = (group < ends.numel()) & (rows >= starts[group.clamp(max=ends.numel() - 1)])
    return ~inside
