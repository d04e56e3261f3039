"""The documented limits of the CANN operators the ascend providers call, each with the page and section
it comes from (docs/ascend.md, *Limits and their sources*). The rule: a number here is the doc's
number; where the doc states none, `UNBOUNDED` says so with the page that was read, instead of a
figure borrowed from another chip's page. Nothing here has been checked on an NPU.

Pages (read 2026-08; repositories as in docs/ascend.md, *Sources*):
- torch_npu pages: Ascend/op-plugin master 517f2e7 `docs/zh/custom_APIs/torch_npu/<page>.md`,
  cross-read with branch 26.1.0 (09024aa) `docs/en|zh/...` where that branch has the page;
- aclnnQuantMatmulV5: hicann/ops-nn e5c3fa9 `matmul/quant_batch_matmul_v4/docs/aclnnQuantMatmulV5.md`;
- aclnnDynamicMxQuantV3: same repository, `quant/dynamic_mx_quant/docs/aclnnDynamicMxQuantV3.md`;
- aclnnGroupedMatmulV5: hicann/ops-transformer e033f88 `gmm/grouped_matmul/docs/aclnnGroupedMatmulV5.md`.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from portable_kernels.core.providers import Limit


@attrs.frozen
class CitedLimit(Limit):
    """A `Limit` with the doc page and section it comes from; the citation is part of the reason a
    provider gives when it declines, and of what `doctor` prints."""

    source: str = ""

    def reason(self, dims: Mapping[str, int]) -> str | None:
        why = super().reason(dims)
        return None if why is None else f"{why} (documented: {self.source})"

    def __str__(self) -> str:
        return f"{super().__str__()} [{self.source}]"


@attrs.frozen
class Unbounded:
    """A size the provider's doc gives no bound for (so the provider declares none)."""

    op: str
    dim: str
    source: str


# -- pages and sections --------------------------------------------------------------------------------------

GMM_TORCH_NPU = "torch_npu-npu_grouped_matmul.md"
GMM_ACLNN = "aclnnGroupedMatmulV5.md"
QMM_TORCH_NPU = "torch_npu-npu_quant_matmul.md"
QMM_ACLNN = "aclnnQuantMatmulV5.md"
FIA = "torch_npu-npu_fused_infer_attention_score.md"
SFA = "torch_npu-npu_sparse_flash_attention.md"
KVQ_SFA = "torch_npu-npu_kv_quant_sparse_flash_attention.md"
MX_QUANT = "aclnnDynamicMxQuantV3.md"

# -- npu_grouped_matmul (Atlas A2/A3) ----------------------------------------------------------------------

#: "group_list 第1维最大支持1024，即最多支持1024个group" (single x / weight / y, group_type 0)
GMM_A2A3_GROUPS = CitedLimit(
    "G", max=1024, source=f"{GMM_TORCH_NPU} 约束说明, group_list 为 Tensor, A2/A3, group_type 0 单单单, item 4; "
                          f"{GMM_ACLNN} 约束说明 › Atlas A3/A2 › groupType 0 单单单: 最大 1024 组")
#: "内轴限制InnerLimit为65536 ... 每一组tensor的最后一维大小都应小于InnerLimit": the last dims are x's K
#: and, for the transposed weight view the providers pass ([G, K, N] view of [G, N, K]), K again — N is
#: not a last dimension here, so it has no documented bound
GMM_A2A3_INNER = CitedLimit(
    "K", max=65535, source=f"{GMM_TORCH_NPU} 约束说明: A2/A3 InnerLimit 65536, last dim of x and of the transposed "
                           f"weight (= K) < InnerLimit; {GMM_ACLNN} 约束说明 › Atlas A3/A2 › 平台约束")

# -- npu_fused_infer_attention_score / sparse attention (MLA) ----------------------------------------------

FIA_MLA_D = CitedLimit("d", min=576, max=576,
                       source=f"{FIA} MLA约束: query D 512 (or 128) with query_rope D 64; the 576 = 512 + 64 form")
FIA_MLA_KV_HEADS = CitedLimit("h_kv", max=1, source=f"{FIA} MLA约束, D = 512: key_rope 要求key的N=1")
SFA_D = CitedLimit("d", min=576, max=576,
                   source=f"{SFA} 约束说明: query / key D 512, query_rope / key_rope D 64")
SFA_KV_HEADS = CitedLimit("h_kv", max=1, source=f"{SFA} 参数说明 key: KV_N只支持1")
KVQ_SFA_D = CitedLimit("d", min=576, max=576,
                       source=f"{KVQ_SFA} 参数说明 query: Q_D值仅支持576 (nope + rope = 512 + 64)")
KVQ_SFA_KV_HEADS = CitedLimit("h_kv", max=1, source=f"{KVQ_SFA} 参数说明 key: KV_N只支持1")

# -- sizes the docs leave unbounded -----------------------------------------------------------------------

UNBOUNDED = (
    Unbounded("fp8_gemm_nt (torch_npu-mx, torch_npu-gb; Ascend 950)", "K, N",
              f"{QMM_ACLNN} 约束说明 › Ascend 950PR/950DT (公共约束, G-B, MX) states no bound on k or n; the "
              f"'x1与x2最后一维的shape大小不能超过65535' of {QMM_TORCH_NPU} 约束说明 is on a page whose 产品支持情况 "
              f"lists Atlas A2/A3/推理 only (and op-plugin's QuantMatmulKernelNpuOpApi.cpp checks 65535 only for "
              f"group_sizes values)"),
    Unbounded("m_grouped_*_gemm_nt_* (torch_npu-mx, torch_npu-950; Ascend 950)", "G, K, N",
              f"{GMM_ACLNN} 约束说明 › Ascend 950PR/950DT (平台约束, groupType 0 单单单) states no group-count or "
              f"inner-dimension bound (the 1024 groups and InnerLimit 65536 are Atlas A2/A3 entries); "
              f"{GMM_TORCH_NPU} has no Ascend 950 entry at all"),
    Unbounded("m_grouped_*_gemm_nt_* (Atlas A2/A3)", "N",
              f"{GMM_TORCH_NPU} 约束说明: InnerLimit bounds the last dimension only, which for the transposed "
              f"weight view is K"),
)

#: npu_dynamic_mx_quant with a FLOAT (fp32) input: "blocksize必须为32" and "量化轴的维度不能小于32"
MX_QUANT_FP32_BLOCK = 32
MX_QUANT_FP32_MIN_AXIS = 32
MX_QUANT_FP32_SOURCE = f"{MX_QUANT} 约束说明: 当x的数据类型为FLOAT时 blocksize必须为32, 量化轴的维度不能小于32"


def all_limits() -> dict[str, CitedLimit]:
    """Every cited limit of this module by name (docs and tests list them)."""
    return {name: value for name, value in globals().items() if isinstance(value, CitedLimit)}
