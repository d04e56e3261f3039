"""Shared pieces of the stand-in: the error type, torch_npu dtype ids, chips, small checks."""

from __future__ import annotations

import torch

#: torch_npu dtype ids (op_plugin/python/meta/_meta_registrations.py: TORCH_NPU_DTYPE_TO_STRING_MAP)
HIFLOAT8 = 290
FLOAT8_E8M0FNU = 293
FLOAT4_E2M1FN_X2 = 296

#: torch_npu.npu.get_soc_version() per chip (vLLM-Ascend: 220-225 A2, 250-255 A3, 260 Ascend 950)
SOC_VERSIONS = {"910b": 223, "910c": 252, "950": 260}

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


class StandInError(RuntimeError):
    """A call that breaks a documented torch_npu / CANN constraint (the message cites the doc)."""


def chip_of(soc: str) -> str:
    """"a2a3" for Atlas A2/A3, "950" for Ascend 950."""
    return "950" if soc == "950" else "a2a3"


def require(condition: bool, message: str) -> None:
    if not condition:
        raise StandInError(message)


def e8m0_bytes(name: str, t: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale bytes as uint8 (torch_npu passes them as uint8 or float8_e8m0fnu tensors)."""
    require(isinstance(t, torch.Tensor) and t.dtype in (torch.uint8, torch.float8_e8m0fnu),
            f"{name}: MX scales are FLOAT8_E8M0 (uint8 / float8_e8m0fnu storage), got "
            f"{getattr(t, 'dtype', type(t).__name__)}")
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def e8m0_values(codes: torch.Tensor) -> torch.Tensor:
    """fp64 value 2^(e - 127) of UE8M0 codes (255 = NaN), computed independently of the library."""
    e = codes.to(torch.float64)
    out = torch.pow(torch.tensor(2.0, dtype=torch.float64), e - 127.0)
    return torch.where(codes == 255, torch.full_like(out, float("nan")), out)


def transposed_last_two(t: torch.Tensor) -> bool:
    """True when the last two dims of `t` are a transposed view of a contiguous tensor (strides
    (1, rows) for its last two dims) — how torch_npu recognises a transposed x2 / scale."""
    if t.dim() < 2 or t.shape[-1] == 1 or t.shape[-2] == 1:
        return False
    return t.stride(-2) == 1 and t.stride(-1) == t.shape[-2]


def transposed_pairs(t: torch.Tensor) -> bool:
    """True when an MX scale tensor (.., a, b, 2) is the transposed view of a contiguous (.., b, a, 2)."""
    if t.dim() < 3 or t.shape[-1] != 2:
        return False
    a = t.shape[-3]
    return t.stride(-1) == 1 and t.stride(-3) == 2 and t.stride(-2) == 2 * a


def contiguous_pairs(t: torch.Tensor) -> bool:
    return t.dim() >= 3 and t.shape[-1] == 2 and t.is_contiguous()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
