"""How the distributed Buffer moves bytes between ranks: a small pluggable transport.

A transport does two things, each a collective over the Buffer's group, each bounded by the
Buffer's timeout:
- `all_gather(header)`: every rank contributes one fixed-size int64 vector and receives all of them
  (the counts and the call's settings, so every rank can check every other rank before payload
  moves) — run as an all-to-all of the repeated header, the fastest small collective on Gloo;
- `all_to_all(out, inp, out_splits, in_splits)`: rows of a 2-D tensor go to each rank in rank
  order, uneven sizes allowed (`all_to_all_single`); rows are raw bytes (uint8), so fp8 and bool
  travel where a backend lacks those dtypes (Gloo has no fp8).

`TorchDistributedTransport` runs both through `torch.distributed` on any ProcessGroup: Gloo (CPU
tensors), NCCL (CUDA), HCCL (NPU, via torch_npu). A collective that fails or exceeds the timeout
raises `EPTimeoutError` naming the group and the op, and the transport stays broken afterwards
(a half-finished collective leaves the group unusable; every later call fails fast).

Seam for fused vendor collectives: an Ascend MC2 transport (torch_npu's
`npu_moe_distribute_dispatch_v2` / `npu_moe_distribute_combine_v2`, which move tokens AND expand
them per expert in one op) does not fit this byte-level protocol; it plugs in one level up, as a
`LowLatencyEngine` (the ascend backend's `vendor/mc2.py`) that the Buffer uses in place of the all-to-all engine on
HCCL groups where torch_npu imports (checked against a stand-in only; not run on an NPU).
"""

from __future__ import annotations

import datetime
import logging
from typing import Protocol, Sequence

import torch

from ...core.errors import EPTimeoutError

log = logging.getLogger(__name__)

#: default collective timeout in seconds (a Buffer's `timeout` argument overrides it)
DEFAULT_TIMEOUT_S = 300.0


class Pending(Protocol):
    """A collective in flight; wait() blocks until it completes (or raises EPTimeoutError)."""

    def wait(self) -> torch.Tensor | None: ...


class Transport(Protocol):
    """What the Buffer needs from a communication library. The start_* forms return at once so
    local work can overlap the collective; the plain forms are start + wait."""

    rank: int
    num_ranks: int
    description: str

    def all_gather(self, header: torch.Tensor, op: str) -> torch.Tensor:
        """A 1-D tensor [F] (same F and dtype on every rank) -> [R, F], row r = rank r's tensor."""

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                   in_splits: Sequence[int], op: str) -> None:
        """Rows inp[sum(in_splits[:d]) : ...] go to rank d; rows from rank s land in out in rank order."""

    def start_all_gather(self, header: torch.Tensor, op: str) -> Pending: ...

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                         in_splits: Sequence[int], op: str) -> Pending: ...


class _Work:
    """A started torch.distributed collective and what its wait() returns."""

    def __init__(self, transport: "TorchDistributedTransport", work: object, result: torch.Tensor | None, op: str,
                 what: str) -> None:
        self.transport, self.work, self.result, self.op, self.what = transport, work, result, op, what

    def wait(self) -> torch.Tensor | None:
        self.transport._wait(self.work, self.op, self.what)
        return self.result


def _as_timedelta(timeout: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


def describe_group(group: object) -> str:
    """A readable name for a ProcessGroup: its description or name, backend and size."""
    name = getattr(group, "group_desc", None) or getattr(group, "group_name", None) or "?"
    try:
        backend = group.name()  # type: ignore[attr-defined]
    except Exception:  # a group that cannot say its backend is still a group
        backend = "?"
    size = group.size() if hasattr(group, "size") else "?"
    return f"'{name}' ({backend}, {size} ranks)"


class TorchDistributedTransport:
    """`all_gather` / `all_to_all_single` of one torch.distributed ProcessGroup, each with a timeout.

    The timeout is passed to the backend per collective (Gloo enforces it inside the op; NCCL's
    `Work.wait(timeout)` blocks the host until completion or the timeout). Any failure becomes an
    EPTimeoutError and marks the transport broken.
    """

    def __init__(self, group: object, timeout: float | datetime.timedelta = DEFAULT_TIMEOUT_S) -> None:
        self.group = group
        self.rank = int(group.rank())  # type: ignore[attr-defined]
        self.num_ranks = int(group.size())  # type: ignore[attr-defined]
        self.timeout = _as_timedelta(timeout)
        self.description = describe_group(group)
        self._broken: str | None = None

    def _fail_fast(self, op: str) -> None:
        if self._broken is not None:
            raise EPTimeoutError(
                f"{op}: process group {self.description} is unusable since an earlier collective failed "
                f"({self._broken}). Fix: destroy the process group, create a new one and a new Buffer.")

    def _wait(self, work: object, op: str, what: str) -> None:
        try:
            work.wait(self.timeout)  # type: ignore[attr-defined]
        except Exception as exc:  # Gloo raises RuntimeError, NCCL DistBackendError; all mean the same here
            self._raise(op, what, exc)

    def _raise(self, op: str, what: str, exc: BaseException) -> None:
        self._broken = f"{op} ({what})"
        seconds = self.timeout.total_seconds()
        cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        log.warning("rank %d: %s failed on group %s: %s", self.rank, op, self.description, cause)
        raise EPTimeoutError(
            f"{op}: the {what} collective on process group {self.description} did not complete on rank "
            f"{self.rank} within the {seconds:g} s timeout: a peer rank died, left, or never made the same call "
            f"(backend said: {cause}). Fix: find the rank that failed or stalled (its own log); then destroy "
            "this process group and create a new one — it cannot be reused.") from exc

    def start_all_gather(self, header: torch.Tensor, op: str) -> _Work:
        # as an all-to-all of the header repeated for every rank: on Gloo that is several times
        # faster than its allgather (benchmarks/ep_bench.py --primitives); NCCL/HCCL do both
        size = header.numel()
        out = torch.empty(self.num_ranks * size, dtype=header.dtype, device=header.device)
        pending = self.start_all_to_all(out, header.contiguous().repeat(self.num_ranks), [size] * self.num_ranks,
                                        [size] * self.num_ranks, op, "header exchange")
        pending.result = out.view(self.num_ranks, size)
        return pending

    def start_all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                         in_splits: Sequence[int], op: str, what: str = "all-to-all") -> _Work:
        from torch._C._distributed_c10d import AllToAllOptions

        self._fail_fast(op)
        opts = AllToAllOptions()
        opts.timeout = self.timeout
        try:
            work = self.group.alltoall_base(out, inp, list(out_splits), list(in_splits), opts)  # type: ignore
        except Exception as exc:
            self._raise(op, what, exc)
        return _Work(self, work, None, op, what)

    def all_gather(self, header: torch.Tensor, op: str) -> torch.Tensor:
        result = self.start_all_gather(header, op).wait()
        assert result is not None  # an all-gather always has a result
        return result

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Sequence[int],
                   in_splits: Sequence[int], op: str) -> None:
        self.start_all_to_all(out, inp, out_splits, in_splits, op).wait()
