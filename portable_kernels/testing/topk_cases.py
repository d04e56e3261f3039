"""Conformance cases for topk, and the property checker tests reuse: indices in range and unique,
values == input[indices] bit for bit, min(selected) >= max(unselected valid), ordering flags, fills
in the right slots — on adversarial rows (ties, ±0, ±inf, NaN past end, 2^17 columns, end < topk)."""

from __future__ import annotations

import functools

import torch

from ..ops.topk import DEFAULT_IDX_FILL, DEFAULT_VALUE_FILL, topk
from .checks import assert_refused
from .core import Case, CaseFailure, conformance_cases
from .generators import generator, randn

#: input kinds the generator knows (see topk_input)
KINDS = ("randn", "ties", "signed_zeros", "infinities", "all_neg_inf")

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(_SAME_WIDTH_INT[x.element_size()])


def topk_input(b: int, n: int, kind: str, seed: int, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """Seeded adversarial rows: "randn"; "ties" (integers in [-3, 3]); "signed_zeros" (±0 and -1);
    "infinities" (randn with ±inf sprinkled in); "all_neg_inf"."""
    g = generator(seed)
    if kind == "randn":
        return randn(b, n, seed=seed, dtype=dtype, device=device)
    if kind == "ties":
        x = torch.randint(-3, 4, (b, n), generator=g).float()
    elif kind == "signed_zeros":
        x = torch.tensor([0.0, -0.0, -1.0])[torch.randint(0, 3, (b, n), generator=g)]
    elif kind == "infinities":
        x = torch.randn(b, n, generator=g)
        pick = torch.rand(b, n, generator=g)
        x = torch.where(pick < 0.05, float("inf"), torch.where(pick > 0.9, float("-inf"), x))
    elif kind == "all_neg_inf":
        x = torch.full((b, n), float("-inf"))
    else:
        raise ValueError(f"unknown topk input kind {kind!r}; known: {KINDS}")
    return x.to(dtype=dtype, device=device)


def random_end(b: int, n: int, topk: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int32 [b] row lengths covering 0, < topk, == topk and up to n."""
    g = generator(seed)
    end = torch.randint(0, n + 1, (b,), generator=g)
    special = [0, min(topk, n), max(min(topk, n) - 1, 0), n]
    end[: min(b, len(special))] = torch.tensor(special[: min(b, len(special))])
    return end.to(dtype=torch.int32, device=device)


def check_topk(input: torch.Tensor, k: int, end: torch.Tensor | None, values: torch.Tensor | None,
               indices: torch.Tensor, *, sorted: bool = False, sorted_index: bool = False,
               indices_type: torch.dtype = torch.int64, idx_oob_fill_value: int = DEFAULT_IDX_FILL,
               value_oob_fill_value: float = DEFAULT_VALUE_FILL, return_value: bool = True) -> None:
    """Raise CaseFailure unless (values, indices) is a valid topk result for `input` (see module doc)."""
    x = input.cpu()
    b, n = x.shape
    indices = indices.cpu()
    values = None if values is None else values.cpu()
    if indices.dtype != indices_type or tuple(indices.shape) != (b, k):
        raise CaseFailure(f"indices: {indices.dtype} {tuple(indices.shape)}, expected {indices_type} {(b, k)}")
    if not return_value:
        if values is not None:
            raise CaseFailure("values returned although return_value=False")
    elif values is None or values.dtype != x.dtype or tuple(values.shape) != (b, k):
        got = None if values is None else f"{values.dtype} {tuple(values.shape)}"
        raise CaseFailure(f"values: {got}, expected {x.dtype} {(b, k)}")
    lengths = torch.full((b,), n) if end is None else end.cpu().to(torch.int64)
    count = lengths.clamp(max=k)
    slot_valid = torch.arange(k)[None, :] < count[:, None]
    idx = indices.to(torch.int64)
    if bool((idx[~slot_valid] != idx_oob_fill_value).any()):
        raise CaseFailure(f"indices: slots past min(topk, end) must hold idx_oob_fill_value {idx_oob_fill_value}")
    in_range = (idx >= 0) & (idx < lengths[:, None])
    if bool((slot_valid & ~in_range).any()):
        r, c = (int(v) for v in (slot_valid & ~in_range).nonzero()[0])
        raise CaseFailure(f"indices: [{r}, {c}] = {int(idx[r, c])} outside the valid range [0, {int(lengths[r])})")
    safe = torch.where(slot_valid, idx, 0)
    hits = torch.zeros(b, n + 1, dtype=torch.int64).scatter_add_(1, torch.where(slot_valid, idx, n),
                                                                  slot_valid.to(torch.int64))
    if bool((hits[:, :n] > 1).any()):
        raise CaseFailure(f"indices: row {int((hits[:, :n] > 1).any(1).nonzero()[0])} selects an element twice")
    if return_value and b and k:
        want = x.gather(1, safe) if n else torch.zeros_like(values)
        if not torch.equal(_bits(values)[slot_valid], _bits(want)[slot_valid]):
            raise CaseFailure("values: differ from input[indices] (compared bit for bit)")
        fill = torch.full((1,), value_oob_fill_value, dtype=x.dtype)
        rest = values[~slot_valid]
        ok = rest.isnan().all() if fill.isnan().all() else torch.equal(_bits(rest), _bits(fill.expand_as(rest)))
        if not ok:
            raise CaseFailure(f"values: slots past min(topk, end) must hold value_oob_fill_value {value_oob_fill_value}")
    selected = hits[:, :n] > 0
    valid = torch.arange(n)[None, :] < lengths[:, None]
    xf = x.float()
    low = torch.where(selected, xf, float("inf")).amin(1) if n else torch.full((b,), float("inf"))
    high = torch.where(valid & ~selected, xf, float("-inf")).amax(1) if n else torch.full((b,), float("-inf"))
    bad = low < high
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise CaseFailure(f"row {r}: an unselected valid element ({float(high[r])}) is larger than a selected one "
                          f"({float(low[r])})")
    if sorted and k > 1:
        v = xf.gather(1, safe) if n else torch.zeros(b, k)
        pair = slot_valid[:, 1:]
        if bool((pair & (v[:, 1:] > v[:, :-1])).any()):
            raise CaseFailure("sorted=True: values are not in non-increasing order")
    if sorted_index and k > 1:
        pair = slot_valid[:, 1:]
        if bool((pair & (idx[:, 1:] <= idx[:, :-1])).any()):
            raise CaseFailure("sorted_index=True: indices are not increasing")


def _case(b: int, n: int, k: int, kind: str, dtype: torch.dtype, with_end: bool, order: str, indices_type,
          return_value: bool, seed: int, device: torch.device) -> float:
    x = topk_input(b, n, kind, seed, dtype, device)
    end = random_end(b, n, k, seed + 1, device) if with_end else None
    if end is not None and n:
        # NaN past each row's end is not a candidate and must be ignored
        past = torch.arange(n, device=device)[None, :] >= end[:, None]
        x = x.masked_fill(past, float("nan"))
    flags = dict(sorted=order == "value", sorted_index=order == "index", indices_type=indices_type,
                 return_value=return_value)
    fills = dict(idx_oob_fill_value=-1, value_oob_fill_value=-7.0) if seed % 2 else {}
    values, indices = topk(x, k, end=end, **flags, **fills)
    check_topk(x, k, end, values, indices, **flags, **fills)
    return 0.0


QUICK = [
    # b, n, k, kind, dtype, with_end, order, indices_type, return_value
    (4, 300, 16, "randn", torch.float32, False, "none", torch.int64, True),
    (4, 300, 16, "randn", torch.bfloat16, True, "value", torch.int32, True),
    (3, 257, 64, "ties", torch.float32, True, "index", torch.int64, True),
    (3, 257, 64, "ties", torch.bfloat16, False, "value", torch.int64, False),
    (2, 64, 8, "signed_zeros", torch.float32, False, "value", torch.int32, True),
    (2, 64, 40, "signed_zeros", torch.bfloat16, True, "index", torch.int64, True),
    (3, 200, 20, "infinities", torch.float32, True, "value", torch.int64, True),
    (2, 50, 10, "all_neg_inf", torch.float32, True, "none", torch.int32, True),
    (5, 12, 32, "randn", torch.float32, True, "value", torch.int64, True),
    (2, 1, 1, "randn", torch.bfloat16, False, "none", torch.int64, True),
    (0, 16, 4, "randn", torch.float32, False, "none", torch.int64, True),
    (2, 1 << 17, 512, "randn", torch.bfloat16, True, "none", torch.int32, True),
    (2, 8192, 4096, "ties", torch.float32, False, "index", torch.int64, True),
]
FULL = QUICK + [
    (16, 1 << 17, 2048, "randn", torch.float32, True, "value", torch.int64, True),
    (64, 4096, 512, "ties", torch.bfloat16, True, "none", torch.int32, True),
    (8, 129280, 4096, "infinities", torch.float32, True, "index", torch.int64, True),
]


def _nan_case(dtype: torch.dtype, with_end: bool, seed: int, device: torch.device) -> float:
    """A NaN inside a row's valid range is refused (the provider's pass finds it)."""
    x = topk_input(3, 300, "randn", seed, dtype, device)
    end = torch.tensor([300, 200, 100], dtype=torch.int32, device=device) if with_end else None
    x[1, 150] = float("nan")
    return assert_refused(lambda: topk(x, 8, end=end), "input", x)


@conformance_cases("topk")
def topk_cases(quick: bool) -> list[Case]:
    cases = []
    for i, spec in enumerate(QUICK if quick else FULL):
        b, n, k, kind, dtype, with_end, order, itype, ret = spec
        seed = 4000 + 10 * i + (i % 2)
        label = (f"b={b} n={n} k={k} {kind} {str(dtype)[6:]} end={with_end} order={order} "
                 f"idx={str(itype)[6:]} values={ret}")
        cases.append(Case("topk", label, seed, functools.partial(_case, *spec, seed)))
    for j, (dtype, with_end) in enumerate(((torch.float32, False), (torch.bfloat16, True))):
        label = f"refuses NaN in a valid range {str(dtype)[6:]} end={with_end}"
        cases.append(Case("topk", label, 4900 + j, functools.partial(_nan_case, dtype, with_end, 4900 + j)))
    return cases
