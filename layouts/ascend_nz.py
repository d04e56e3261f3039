"""Ascend operand Formats whose data a CANN matmul takes in FRACTAL_NZ (docs/ascend.md, *FRACTAL_NZ*).

Rule: the Format's bytes on CPU tensors are its ND parent's (same encode, decode, validate); on an NPU
the backend casts the data once at ingest with `torch_npu.npu_format_cast(x, 29)`, which keeps the
logical shape `[..., N, K]` and stores the tiles of `nz.nd_to_nz` (`nz_storage` below says which
bytes those are). The name records the cast, so a prepared operand says where it stands.

- `ASCEND_BF16_VALUES_NZ` (Atlas A2/A3): `ASCEND_BF16_VALUES` (bf16 values data x scale, exact for
  power-of-two scales) stored NZ on an NPU: bf16 C0 = 16, an `[N, K]` weight becomes
  `[ceil(K/16), ceil(N/16), 16, 16]`, which is aclnnMatmulWeightNz's "B矩阵转置时 (k1, n1, n0, k0),
  n0 = 16, k0 = 16" (the `b.t()` the GEMM passes). Worked example: N = 2, K = 3 values
  [[a b c], [d e f]] -> one tile [0][0] whose rows 0, 1 are [a b c 0 ... 0], [d e f 0 ... 0]
  (16 columns), rows 2..15 zero.
"""

from __future__ import annotations

import torch

from .ascend import ASCEND_BF16_VALUES
from .format import Format
from .nz import nd_to_nz

__all__ = ["NPU_FORMAT_ND", "NPU_FORMAT_FRACTAL_NZ", "ASCEND_BF16_VALUES_NZ", "NZ_FORMATS", "nz_storage"]

#: torch_npu's format ids (torch_npu.Format.ND / FRACTAL_NZ; ACL_FORMAT_FRACTAL_NZ = 29)
NPU_FORMAT_ND = 2
NPU_FORMAT_FRACTAL_NZ = 29

ASCEND_BF16_VALUES_NZ = Format(
    name="ascend-dequantized-bf16+npu-nz",
    elements=ASCEND_BF16_VALUES.elements,
    scale_storage=ASCEND_BF16_VALUES.scale_storage,
    granularity=ASCEND_BF16_VALUES.granularity,
    requires_pow2=ASCEND_BF16_VALUES.requires_pow2,
    encode=ASCEND_BF16_VALUES.encode,
    decode=ASCEND_BF16_VALUES.decode,
    storage_granularity=ASCEND_BF16_VALUES.storage_granularity,
    data_layout="bf16 values data x scale, logical [(G,) N, K]; on an NPU FRACTAL_NZ (npu_format_cast(x, 29) once "
                "at ingest: tiles [(G,) ceil(K/16), ceil(N/16), 16, 16]); ND bytes on CPU tensors (emulation)",
    validate=ASCEND_BF16_VALUES.validate,
)

#: the Formats whose data the backend casts to FRACTAL_NZ on an NPU, by name
NZ_FORMATS = frozenset({ASCEND_BF16_VALUES_NZ.name})


def nz_storage(data: torch.Tensor) -> torch.Tensor:
    """The bytes an NPU holds for `data` [..., N, K] after npu_format_cast(data, 29):
    `nd_to_nz(data)`, [..., ceil(K/C0), ceil(N/16), 16, C0] with zero padding (C0 = 32 bytes)."""
    return nd_to_nz(data)
