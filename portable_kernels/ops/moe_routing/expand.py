"""`expand_to_fused` / `expand_to_fused_with_sf`: copy tokens (and their per-token scales) bit for bit
into the expert-major layout — reference, contracts and public ops."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_bool, check_int, check_tensor
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.providers import Inputs
from ...layouts.constants import SM100_BLOCKS_PER_WORD
from ...core.tensors import FP8_DTYPE, PreparedTensor, QuantTensor, cdiv, describe
from .mapping import INDEX_DTYPES, FusedMapping, _check_expand_mapping, _unpack_mapping

_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(x: torch.Tensor) -> torch.Tensor:
    """`x` viewed as the integer dtype of its width, so copies are bit-exact for every dtype (fp8 too)."""
    return x.view(_SAME_WIDTH_INT[x.element_size()])


# ---------------------------------------------------------------------------------------------
# reference math


def expand_to_fused_reference(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                              x_sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Copy token rows (and their per-token scales) to their positions, bit for bit; every other row
    is zero. x [T, H] -> [P, H]; x_sf fp32 [T, S] -> [P, S] or None."""
    num_rows = pos_to_expert.numel()
    pos = token_topk_to_pos.to(torch.int64)
    valid = pos >= 0
    token = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)[valid]
    outs = []
    for src in (x, x_sf):
        if src is None:
            outs.append(None)
            continue
        out = torch.zeros(num_rows, src.shape[1], dtype=_bits(src).dtype, device=src.device)
        out[pos[valid]] = _bits(src)[token]
        outs.append(out.view(src.dtype))
    return outs[0], outs[1]


@attrs.frozen
class ExpandInputs(Inputs):
    """One expand_to_fused(_with_sf) call (validated): x [T, H] (any dtype, copied bit for bit),
    x_sf None or fp32 [T, S]; the mapping; out [P, H] and out_sf (any strides) to write."""

    x: torch.Tensor
    x_sf: torch.Tensor | None
    token_topk_to_pos: torch.Tensor
    pos_to_expert: torch.Tensor
    out: torch.Tensor
    out_sf: torch.Tensor | None
    device_field = "x"

    def dims(self) -> dict[str, int]:
        t, h = self.x.shape
        return {"T": t, "H": h, "k": self.token_topk_to_pos.shape[1], "P": self.out.shape[0]}


def expand_to_fused_kernel(call: ExpandInputs) -> None:
    """Reference kernel of expand_to_fused(_with_sf): writes out (and out_sf, any strides)."""
    expanded, expanded_sf = expand_to_fused_reference(call.x, call.token_topk_to_pos, call.pos_to_expert, call.x_sf)
    _bits(call.out).copy_(_bits(expanded))
    if call.out_sf is not None:
        call.out_sf.copy_(expanded_sf)


EXPAND_TO_FUSED = register_contract(OpContract("expand_to_fused", expand_to_fused_reference,
                                               Tolerance(dequantized=0.0), kernel=expand_to_fused_kernel))
EXPAND_TO_FUSED_WITH_SF = register_contract(OpContract("expand_to_fused_with_sf", expand_to_fused_reference,
                                                       Tolerance(dequantized=0.0), kernel=expand_to_fused_kernel))


# ---------------------------------------------------------------------------------------------
# public ops


def _run_expand(contract: OpContract, x: torch.Tensor, x_sf: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                pos_to_expert: torch.Tensor, col_major_sf: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    op = contract.name
    t = x.shape[0]
    check_tensor(op, "token_topk_to_pos", token_topk_to_pos, INDEX_DTYPES, (t, None), x.device,
                  f"pass the [num_tokens = {t}, num_topk] mapping from get_fused_mapping")
    check_tensor(op, "pos_to_expert", pos_to_expert, INDEX_DTYPES, (None,), x.device,
                  "pass pos_to_expert [P] from get_fused_mapping")
    _check_expand_mapping(op, token_topk_to_pos, pos_to_expert)
    rows = pos_to_expert.numel()
    out = torch.empty(rows, x.shape[1], dtype=x.dtype, device=x.device)
    out_sf = None
    if x_sf is not None:
        s = x_sf.shape[1]
        if col_major_sf:
            # TMA-aligned MN-major storage (stride (1, align(P, 4))), the same fp32 values as row-major
            padded = cdiv(rows, 4) * 4
            out_sf = torch.empty(s, padded, dtype=x_sf.dtype, device=x.device)[:, :rows].T
        else:
            out_sf = torch.empty(rows, s, dtype=x_sf.dtype, device=x.device)
    run(contract, ExpandInputs(x, x_sf, token_topk_to_pos, pos_to_expert, out, out_sf))
    return out, out_sf


@public_op(EXPAND_TO_FUSED)
def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor | FusedMapping,
                    pos_to_expert: torch.Tensor | None = None) -> torch.Tensor:
    """Copy each token into its rows of the expert-major layout (TileKernels `expand_to_fused`).

    x: [T, H] of any dtype (copied bit for bit); token_topk_to_pos: int32 [T, k] (or a FusedMapping,
    then pos_to_expert is taken from it); pos_to_expert: int32 [P]. Returns [P, H] of x's dtype with
    padding rows (pos_to_expert < 0) zero.
    """
    if is_compiling():
        return compiled_call("expand_to_fused", x, token_topk_to_pos, pos_to_expert)
    op = EXPAND_TO_FUSED.name
    ttp, pte = _unpack_mapping(op, token_topk_to_pos, pos_to_expert, need_pos_to_expert=True)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.element_size() not in _SAME_WIDTH_INT:
        raise ContractError(format_problem(op, "x", describe(x), "a 2-D tensor [num_tokens, hidden]",
                                           "pass token activations [T, H]; for FP8 with scales use "
                                           "expand_to_fused_with_sf"))
    return _run_expand(EXPAND_TO_FUSED, x, None, ttp, pte, False)[0]


@public_op(EXPAND_TO_FUSED_WITH_SF)
def expand_to_fused_with_sf(x: Any, num_per_channels: int, token_topk_to_pos: torch.Tensor | FusedMapping,
                            pos_to_expert: torch.Tensor | None = None,
                            use_tma_aligned_col_major_sf: bool = False
                            ) -> QuantTensor | tuple[torch.Tensor, torch.Tensor]:
    """Copy FP8 tokens and their per-token scales into the expert-major layout (TileKernels
    `expand_to_fused_with_sf`).

    x: (fp8 [T, H], scales) — a tuple or QuantTensor with granularity (1, num_per_channels); the
       scales are the logical fp32 [T, ceil(H/num_per_channels)], or int32 [T, ceil(ceil(H/
       num_per_channels)/4)] words of four UE8M0 exponents (SM100 / TileKernels' packed form, any
       strides), copied word for word
    token_topk_to_pos / pos_to_expert: as in expand_to_fused
    use_tma_aligned_col_major_sf: store the output scales MN-major with the row count padded to 4
       (strides (1, align(P, 4))); the values are the same either way
    Returns a QuantTensor(fp8 [P, H], fp32 [P, S]) that unpacks as (out, out_sf), or for packed
    int32 scales the tuple (out, int32 out_sf); padding rows are 0.
    """
    if is_compiling():
        return compiled_call("expand_to_fused_with_sf", x, num_per_channels, token_topk_to_pos, pos_to_expert,
                             use_tma_aligned_col_major_sf)
    op = EXPAND_TO_FUSED_WITH_SF.name
    ttp, pte = _unpack_mapping(op, token_topk_to_pos, pos_to_expert, need_pos_to_expert=True)
    check_int(op, "num_per_channels", num_per_channels, 1, fix="pass the scale block size, e.g. 128")
    if isinstance(x, PreparedTensor):
        raise ContractError(format_problem(op, "x", describe(x), "logical (fp8 data, fp32 scales)",
                                           "pass the quantizer's QuantTensor, not a backend-prepared operand"))
    if isinstance(x, QuantTensor) and x.granularity != (1, num_per_channels):
        raise ContractError(format_problem(op, "x", f"scaled with granularity {x.granularity}",
                                           f"(1, num_per_channels) = (1, {num_per_channels})",
                                           "pass num_per_channels equal to the quantizer's gran_k"))
    if not (isinstance(x, (tuple, list, QuantTensor)) and len(tuple(x)) == 2):
        raise ContractError(format_problem(op, "x", describe(x), "a (fp8 data, fp32 scales) pair",
                                           "quantize with per_token_cast_to_fp8 first"))
    data, sf = tuple(x)
    check_tensor(op, "x", data, (FP8_DTYPE,), (None, None), None, "pass fp8 e4m3 data [T, H]")
    t, h = data.shape
    s = cdiv(h, num_per_channels)
    packed = isinstance(sf, torch.Tensor) and sf.dtype == torch.int32
    if packed:
        words = cdiv(s, SM100_BLOCKS_PER_WORD)
        check_tensor(op, "x", sf, (torch.int32,), (t, words), data.device,
                     f"pass packed UE8M0 scales int32 [T, ceil(ceil(H/{num_per_channels})/4)] = [{t}, {words}]")
        # words travel as fp32 bit patterns: every provider copies scales bit for bit and nothing else
        sf = sf.view(torch.float32)
    else:
        check_tensor(op, "x", sf, (torch.float32,), (t, s), data.device,
                     f"pass fp32 scales [T, ceil(H/{num_per_channels})] = [{t}, {s}], or packed int32 words")
    check_bool(op, "use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    out, out_sf = _run_expand(EXPAND_TO_FUSED_WITH_SF, data, sf, ttp, pte, use_tma_aligned_col_major_sf)
    if packed:
        return out, out_sf.view(torch.int32)
    ue8m0 = x.ue8m0 if isinstance(x, QuantTensor) else False
    return QuantTensor(out, out_sf, (1, num_per_channels), ue8m0=ue8m0)
