"""What the distributed Buffer puts on the wire: the per-call header and byte-packed rows.

Every Buffer op starts with one all-gather of a fixed-size int64 header per rank (`header`): the
op and call number, whether the rank accepted its own arguments, the settings that must agree
across ranks (num_experts, hidden, payload form, top-k, ...), its buffer budget, and per peer the
rows it will send and the rows it expects (and, for a combine, fingerprints of their order).
Every rank then sees every rank's header, so argument errors, mismatched settings, oversized
calls and mismatched handles are reported on ALL ranks before any payload moves — never one rank
raising while the others wait in a collective.

Rows travel as uint8 (`as_bytes`): fp8 and bool have no dtype on some backends (Gloo), and
several per-row tensors (scales, top-k ids, weights, source index) pack into one row so one
collective moves them all (`pack_rows` / `unpack_rows`).
"""

from __future__ import annotations

import enum
from typing import Sequence

import attrs
import torch

from ...core.errors import ContractError

#: first header field, so a peer running another protocol version (or garbage) is recognised
MAGIC = 0x45505F31  # "EP_1"


class Field(enum.IntEnum):
    """Header fields before the per-peer counts."""

    MAGIC = 0
    OP = 1            # OpCode
    SEQ = 2           # this Buffer's call number on this rank
    STATUS = 3        # 0: arguments accepted; 1: this rank refused its own arguments
    NUM_EXPERTS = 4
    HIDDEN = 5
    FORM = 6          # payload form code (FORMS)
    NUM_TOPK = 7      # 0 without top-k
    HAS_WEIGHTS = 8
    NUM_TOKENS = 9    # tokens this rank dispatches (or combines back)
    BUDGET = 10       # this rank's buffer bytes for the call's mode
    MAX_TOKENS = 11   # low latency: num_max_dispatch_tokens_per_rank
    FLAGS = 12        # low latency: use_fp8 | round_scale << 1 | use_ue8m0 << 2
    ROW_BYTES = 13    # bytes per payload row


NUM_FIELDS = len(Field)


class OpCode(enum.IntEnum):
    DISPATCH = 1
    CACHED_DISPATCH = 2
    COMBINE = 3
    LOW_LATENCY_DISPATCH = 4
    LOW_LATENCY_COMBINE = 5


#: payload forms: the token dtype, or an FP8 pair
FORMS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, "fp8": 4}
FORM_NAMES = {code: str(form).replace("torch.", "") for form, code in FORMS.items()}

#: sentinel for "no expectation" in the expected-rows half of the header
UNKNOWN = -1


def header(fields: dict[Field, int], send_rows: Sequence[int], expect_rows: Sequence[int] | None,
           device: torch.device, send_marks: Sequence[int] | None = None,
           expect_marks: Sequence[int] | None = None) -> torch.Tensor:
    """int64 [NUM_FIELDS + 4R]: fields (unset = 0); per rank: rows to send to it, rows expected
    from it, and the fingerprints (`fingerprint`) of the row order sent / expected (UNKNOWN where
    this rank cannot know)."""
    num_ranks = len(send_rows)
    values = [0] * NUM_FIELDS
    values[Field.MAGIC] = MAGIC
    for key, value in fields.items():
        values[key] = int(value)
    for column in (send_rows, expect_rows, send_marks, expect_marks):
        values += [UNKNOWN] * num_ranks if column is None else [int(v) for v in column]
    return torch.tensor(values, dtype=torch.int64).to(device)


@attrs.frozen
class Headers:
    """All ranks' headers: fields[r], send[src][dst], expect[dst][src], and the same for marks."""

    fields: list[list[int]]
    send: list[list[int]]
    expect: list[list[int]]
    send_marks: list[list[int]]
    expect_marks: list[list[int]]


def split_headers(gathered: torch.Tensor, num_ranks: int) -> Headers:
    """[R, NUM_FIELDS + 4R] -> Headers."""
    rows = gathered.cpu().tolist()

    def column(i: int) -> list[list[int]]:
        start = NUM_FIELDS + i * num_ranks
        return [r[start:start + num_ranks] for r in rows]

    return Headers([r[:NUM_FIELDS] for r in rows], column(0), column(1), column(2), column(3))


#: fingerprints are sums of ((index + 1) * (position + FINGERPRINT_OFFSET)) mod this prime
FINGERPRINT_MOD = 2**31 - 1
FINGERPRINT_OFFSET = 7919


def fingerprints(indices: torch.Tensor, blocks: Sequence[int]) -> list[int]:
    """One order-sensitive number per consecutive block of a 1-D index vector (block sizes
    `blocks`): two blocks with the same indices in another order differ (up to rare collisions),
    so a combine can prove, before moving data, that rows come back in the order they left."""
    device = indices.device
    sizes = torch.tensor(list(blocks), dtype=torch.int64, device=device)
    block = torch.repeat_interleave(torch.arange(len(blocks), device=device), sizes)
    position = torch.arange(indices.numel(), device=device) - (sizes.cumsum(0) - sizes)[block]
    terms = ((indices.long() + 1) * (position + FINGERPRINT_OFFSET)) % FINGERPRINT_MOD
    sums = torch.zeros(len(blocks), dtype=torch.int64, device=device).index_add_(0, block, terms)
    return (sums % FINGERPRINT_MOD).tolist()


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (everything after the first dimension) of t."""
    width = t.element_size()
    for s in t.shape[1:]:
        width *= s
    return width


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor [N, ...] as uint8 [N, row bytes] (a view when t is contiguous; empty tensors too)."""
    if t.numel() == 0:  # empty tensors may carry strides a dtype view refuses
        return torch.empty((t.shape[0], row_bytes(t)), dtype=torch.uint8, device=t.device)
    t = t.contiguous()
    return t.view(torch.uint8).view(t.shape[0], row_bytes(t))


def pack_rows(parts: Sequence[torch.Tensor], rows: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [N, sum of part bytes]: part i's row bytes side by side, for the selected `rows` (all
    when None). Every part has the same first dimension. `out`: a contiguous uint8 area to fill."""
    columns = [as_bytes(p) for p in parts]
    packed = torch.cat(columns, dim=1) if len(columns) > 1 else columns[0]
    if rows is None:
        return packed if out is None else out.copy_(packed)
    if out is None:
        return packed.index_select(0, rows)
    return torch.index_select(packed, 0, rows, out=out)


def unpack_rows(packed: torch.Tensor, specs: Sequence[tuple[torch.dtype, tuple[int, ...]]]) -> list[torch.Tensor]:
    """Inverse of pack_rows: (dtype, per-row shape) per part -> fresh contiguous tensors [N, *shape]."""
    out, offset = [], 0
    n = packed.shape[0]
    for dtype, shape in specs:
        width = torch.empty((0, *shape), dtype=dtype).element_size()
        for size in shape:
            width *= size
        part = torch.empty((n, width), dtype=torch.uint8, device=packed.device)
        part.copy_(packed[:, offset:offset + width])
        out.append(part.view(dtype).view(n, *shape))
        offset += width
    if offset != packed.shape[1]:
        raise ContractError(f"wire: a packed row holds {packed.shape[1]} bytes but the parts describe {offset}; "
                            "this is a bug in portable_kernels.ops.ep, please report it")
    return out
