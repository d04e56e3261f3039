"""`reduce_fused`: the weighted sum of each token's expert rows back to token order, fp32 accumulation —
reference, contract and public op."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from ...core.checks import check_tensor
from ...core.compiled import compiled_call, is_compiling
from ...core.contract import OpContract, Tolerance, public_op, register_contract
from ...core.dispatch import run
from ...core.errors import ContractError, format_problem
from ...core.numerics import fma_fp32
from ...layouts import FP8_E4M3_MAX
from ...core.providers import Inputs
from ...core.tensors import FP8_DTYPE, describe
from .mapping import INDEX_DTYPES, FusedMapping, _check_positions, _unpack_mapping

REDUCE_DTYPES = (torch.bfloat16, torch.float32)
FP8_FORMATS = ("", "e4m3")


# ---------------------------------------------------------------------------------------------
# reference math


def reduce_fused_reference(x: torch.Tensor, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
                           x_sf: torch.Tensor | None = None, sf: torch.Tensor | None = None,
                           fp8: bool = False) -> torch.Tensor:
    """fp32 [T, H]: Σ over the token's mapped rows of x[pos] · weight (· x_sf[pos]), fp32 accumulation in
    slot order, each term added by one fma (the weight times x_sf rounded first, as TileKernels);
    padding slots (pos < 0) contribute nothing and padding rows are never read. With fp8 output the
    sum is multiplied by sf (if given) and clamped to ±448, ready for the cast."""
    pos = token_topk_to_pos.to(torch.int64)
    valid = pos >= 0
    safe = pos.clamp(min=0)
    scale = torch.ones(pos.shape, dtype=torch.float32, device=pos.device) if topk_weights is None \
        else topk_weights.float()
    if x_sf is not None:
        scale = scale * x_sf.float()[safe]
    # TileKernels' order: slot by slot, each term one fma into the fp32 sum (a rounding per slot, not two)
    xf = x.float()
    out = torch.zeros(pos.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for slot in range(pos.shape[1]):
        term = fma_fp32(xf[safe[:, slot]], scale[:, slot, None], out)
        out = torch.where(valid[:, slot, None], term, out)
    if fp8:
        if sf is not None:
            out = out * sf.float()
        out = out.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return out


@attrs.frozen
class ReduceInputs(Inputs):
    """One reduce_fused call (validated): x bf16/fp32 [P, H], x_sf None or fp32 [P], topk_weights None
    or fp32 [T, k], token_topk_to_pos [T, k], sf None or fp32 [1], fp8 output flag, out [T, H]."""

    x: torch.Tensor
    x_sf: torch.Tensor | None
    topk_weights: torch.Tensor | None
    token_topk_to_pos: torch.Tensor
    sf: torch.Tensor | None
    fp8: bool
    out: torch.Tensor
    device_field = "x"

    def dims(self) -> dict[str, int]:
        p, h = self.x.shape
        t, k = self.token_topk_to_pos.shape
        return {"P": p, "H": h, "T": t, "k": k}


def reduce_fused_kernel(call: ReduceInputs) -> None:
    """Reference kernel of reduce_fused: writes the (cast) fp32 sums into out."""
    call.out.copy_(reduce_fused_reference(call.x, call.topk_weights, call.token_topk_to_pos, call.x_sf, call.sf,
                                          call.fp8))


REDUCE_FUSED = register_contract(OpContract("reduce_fused", reduce_fused_reference, Tolerance(dequantized=1e-9),
                                            kernel=reduce_fused_kernel))


# ---------------------------------------------------------------------------------------------
# public ops


@public_op(REDUCE_FUSED)
def reduce_fused(x: Any, topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor | FusedMapping,
                 fp8_format: str = "", sf: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted sum of each token's expert rows back to token order (TileKernels `reduce_fused`).

    x: bf16/fp32 [P, H], or a pair (x, x_sf fp32 [P]) whose per-row scales multiply the rows
    topk_weights: None (plain sum) or fp32 [T, k]
    token_topk_to_pos: int32 [T, k] (or a FusedMapping); negative slots contribute nothing, and rows no
        slot points to (padding) are never read
    fp8_format: "" (output in x's dtype) or "e4m3" (output fp8: the fp32 sum times sf, clamped to ±448)
    sf: None or fp32 [1], only with fp8_format "e4m3"
    out: None or a contiguous [T, H] tensor of the output dtype to write into
    Accumulates in fp32 slot by slot, one fma per term (TileKernels' rounding); returns the output [T, H].
    """
    if is_compiling():
        return compiled_call("reduce_fused", x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
    op = REDUCE_FUSED.name
    ttp, _ = _unpack_mapping(op, token_topk_to_pos, None, need_pos_to_expert=False)
    x_sf = None
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ContractError(format_problem(op, "x", describe(tuple(x)), "a tensor or an (x, x_sf) pair",
                                               "pass the expert outputs, optionally with per-row scales"))
        x, x_sf = x
    check_tensor(op, "x", x, REDUCE_DTYPES, (None, None), None, "pass expert outputs as bf16/fp32 [P, H]")
    rows, h = x.shape
    device = x.device
    if x_sf is not None:
        check_tensor(op, "x_sf", x_sf, (torch.float32,), (rows,), device, f"pass fp32 per-row scales [{rows}]")
    check_tensor(op, "token_topk_to_pos", ttp, INDEX_DTYPES, (None, None), device,
                  "pass token_topk_to_pos [T, k] from get_fused_mapping")
    t, k = ttp.shape
    if topk_weights is not None:
        check_tensor(op, "topk_weights", topk_weights, (torch.float32,), (t, k), device,
                      f"pass fp32 [{t}, {k}] weights (or None for a plain sum)")
    if fp8_format not in FP8_FORMATS:
        raise ContractError(format_problem(op, "fp8_format", repr(fp8_format), f"one of {FP8_FORMATS}",
                                           "pass '' for output in x's dtype or 'e4m3' for FP8"))
    fp8 = fp8_format == "e4m3"
    if sf is not None:
        if not fp8:
            raise ContractError(format_problem(op, "sf", describe(sf), "None unless fp8_format='e4m3'",
                                               "drop sf, or ask for FP8 output"))
        check_tensor(op, "sf", sf, (torch.float32,), (1,), device, "pass an fp32 [1] output scale")
    out_dtype = FP8_DTYPE if fp8 else x.dtype
    if out is None:
        out = torch.empty(t, h, dtype=out_dtype, device=device)
    else:
        check_tensor(op, "out", out, (out_dtype,), (t, h), device, f"allocate out as {out_dtype} [{t}, {h}]")
        if not out.is_contiguous():
            raise ContractError(format_problem(op, "out", f"non-contiguous (strides {out.stride()})", "contiguous",
                                               "pass a contiguous buffer"))
    _check_positions(op, ttp, rows)
    run(REDUCE_FUSED, ReduceInputs(x, x_sf, topk_weights, ttp, sf, fp8, out))
    return out
