"""What the distributed Buffer puts on the wire: the per-call header and byte-packed rows.

Every Buffer op starts with one all-gather of a fixed-size int64 header per rank (`Header`): the
op and call number, whether the rank accepted its own arguments, the settings that must agree
across ranks (num_experts, hidden, payload form, top-k, ...), its buffer budget, and per peer the
rows it will send and the rows it expects. Every rank then sees every rank's header, so argument
errors, mismatched settings, oversized calls and mismatched handles are reported on ALL ranks
before any payload moves — never one rank raising while the others wait in a collective.

Rows travel as uint8 (`as_bytes`): fp8 and bool have no dtype on some backends (Gloo), and
several per-row tensors (scales, top-k ids, weights, source index) pack into one row so one
collective moves them all (`pack_rows` / `unpack_rows`).
"""

from __future__ import annotations

import enum
from typing import Sequence

import torch

from ..errors import ContractError

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
           device: torch.device) -> torch.Tensor:
    """int64 [NUM_FIELDS + 2R]: fields (unset = 0), rows to send to each rank, rows expected from
    each rank (UNKNOWN where this rank cannot know)."""
    num_ranks = len(send_rows)
    values = [0] * NUM_FIELDS
    values[Field.MAGIC] = MAGIC
    for key, value in fields.items():
        values[key] = int(value)
    expect = [UNKNOWN] * num_ranks if expect_rows is None else [int(v) for v in expect_rows]
    return torch.tensor(values + [int(v) for v in send_rows] + expect, dtype=torch.int64).to(device)


def split_headers(gathered: torch.Tensor, num_ranks: int) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """[R, NUM_FIELDS + 2R] -> (fields per rank, send rows [src][dst], expected rows [dst][src])."""
    rows = gathered.cpu().tolist()
    fields = [r[:NUM_FIELDS] for r in rows]
    send = [r[NUM_FIELDS:NUM_FIELDS + num_ranks] for r in rows]
    expect = [r[NUM_FIELDS + num_ranks:] for r in rows]
    return fields, send, expect


def row_bytes(t: torch.Tensor) -> int:
    """Bytes of one row (everything after the first dimension) of t."""
    width = t.element_size()
    for s in t.shape[1:]:
        width *= s
    return width


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor [N, ...] as uint8 [N, row bytes] (a view when t is contiguous; empty tensors too)."""
    t = t.contiguous()
    return t.view(torch.uint8).view(t.shape[0], row_bytes(t))


def pack_rows(parts: Sequence[torch.Tensor], rows: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [N, sum of part bytes]: part i's row bytes side by side, for the selected `rows` (all
    when None). Every part has the same first dimension."""
    columns = [as_bytes(p) for p in parts]
    packed = torch.cat(columns, dim=1) if len(columns) > 1 else columns[0]
    return packed if rows is None else packed.index_select(0, rows)


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
                            "this is a bug in portable_kernels.ep, please report it")
    return out
