"""The cpu backend's providers of the expert-parallel Buffer's row passes (the internal ops of
portable_kernels.ops.ep.rows): "reference" (the torch code) and "native" (C++ in ep.cpp, one
pass each: the dispatch's send side, its received metadata, the combine's fp32 sum).

Bytes equal the reference's: the same rows in the same order, the same fp32 additions in the same
order with one rounding to bf16 (tests/backends/cpu/test_cpu_ep_rows.py, and the Buffer tests on
2 and 4 Gloo ranks). The native combine sums bf16 rows only; fp16 / fp32 combines decline to the
reference.
"""

from __future__ import annotations

from pathlib import Path

import torch

from portable_kernels.core.native.build import I32, I64, PTR, NativeLibrary, num_threads, register_library
from portable_kernels.core.errors import ContractError
from portable_kernels.core.oracle import REFERENCE_PROVIDER
from portable_kernels.ops.ep.rows import (COMBINE_ROWS, PACK_DISPATCH_ROWS, UNPACK_DISPATCH_META, CombineInputs,
                                          PackInputs, UnpackInputs, combine_reference, pack_reference,
                                          unpack_reference)
from portable_kernels.ops.ep.wire import row_bytes

from .._names import BACKEND, NATIVE

LIB = register_library(NativeLibrary("cpu_ep", Path(__file__).parent.parent / "kernels" / "ep.cpp", {
    "pk_ep_pack": [PTR, I64, I64, PTR, I64, I64, I32, PTR, PTR, I32, PTR, PTR, PTR, I64, I32],
    "pk_ep_unpack": [PTR, I64, I64, I64, I64, I64, I32, I32, I32, I64, I64, PTR, PTR, PTR, PTR, PTR],
    "pk_ep_combine": [PTR, I64, I64, I64, PTR, PTR, I64, I32, PTR, PTR, PTR, I32],
}, returns={"pk_ep_pack": I32, "pk_ep_combine": I32}, owner=BACKEND))


def _lib(op: str):
    lib = LIB.get()
    if lib is None:
        raise RuntimeError(f"{op}: native EP row passes unavailable: {LIB.reason()}")
    return lib


def _ptrs(tensors) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tensors] or [0], dtype=torch.int64)


def _bug(op: str, what: str) -> ContractError:
    return ContractError(f"{op}: {what}; this is a bug in portable_kernels.ops.ep, please report it")


def pack_native(call: PackInputs) -> None:
    op = PACK_DISPATCH_ROWS.name
    lib = _lib(op)
    x = call.x.contiguous()
    in_rank = call.is_token_in_rank.contiguous()
    parts = [p.contiguous() for p in call.parts]
    num_tokens, num_ranks = in_rank.shape
    data_bytes = row_bytes(x)
    counts = list(call.counts)
    sent = sum(counts)
    if len(counts) != num_ranks or len(call.blocks) != num_ranks or call.dest_token.numel() != sent:
        raise _bug(op, f"{len(counts)} counts / {len(call.blocks)} blocks for {num_ranks} ranks and "
                   f"{call.dest_token.numel()} rows")
    for d, (count, block) in enumerate(zip(counts, call.blocks)):
        if block is not None and (block.dtype != torch.uint8 or not block.is_contiguous()
                                  or tuple(block.shape) != (count, data_bytes)):
            raise _bug(op, f"the block of rank {d} is {tuple(block.shape)} {block.dtype}, not contiguous uint8 "
                       f"[{count}, {data_bytes}]")
    meta_bytes = 0 if call.meta is None else call.meta.shape[1]
    if call.meta is not None and (meta_bytes != sum(row_bytes(p) for p in parts) + 4 * call.with_src
                                  or not call.meta.is_contiguous() or call.meta.shape[0] != sent):
        raise _bug(op, "the metadata area does not match its parts")
    if any(p.shape[0] != num_tokens for p in parts) or x.shape[0] != num_tokens:
        raise _bug(op, "a metadata part has another token count than x")
    part_bytes = torch.tensor([row_bytes(p) for p in parts] or [0], dtype=torch.int64)
    keep = _ptrs(parts)
    block_ptrs = torch.tensor([0 if b is None or not b.numel() else b.data_ptr() for b in call.blocks],
                              dtype=torch.int64)
    count_t = torch.tensor(counts, dtype=torch.int64)
    status = lib.pk_ep_pack(in_rank.data_ptr(), num_tokens, num_ranks, x.data_ptr(), data_bytes, data_bytes,
                            len(parts), keep.data_ptr(), part_bytes.data_ptr(), int(call.with_src),
                            count_t.data_ptr(), block_ptrs.data_ptr(),
                            0 if call.meta is None else call.meta.data_ptr(), meta_bytes, num_threads())
    if status != 0:
        raise _bug(op, f"is_token_in_rank does not count the rows {counts} per destination")


def unpack_native(call: UnpackInputs):
    op = UNPACK_DISPATCH_META.name
    lib = _lib(op)
    meta = call.meta.contiguous()
    received, rows, k = meta.shape[0], call.rows, call.num_topk
    with_ids = call.topk_dtype is not None
    id_bytes = 0 if not with_ids else torch.empty((), dtype=call.topk_dtype).element_size()
    expected = 4 * call.num_scales + (k * (id_bytes + 4 * call.has_weights) if with_ids else 0) + 4 * call.has_src
    if meta.dtype != torch.uint8 or meta.dim() != 2 or meta.shape[1] != expected or rows < received:
        raise _bug(op, f"metadata rows {tuple(meta.shape)} do not hold the {expected} bytes described")
    scales = torch.empty((rows, call.num_scales), dtype=torch.float32) if call.num_scales else None
    idx = torch.empty((rows, k), dtype=call.topk_dtype) if with_ids else None
    weights = torch.empty((rows, k), dtype=torch.float32) if with_ids and call.has_weights else None
    counts = torch.empty(call.per_rank, dtype=torch.int64) if with_ids else None
    src = torch.empty(received, dtype=torch.int32) if call.has_src else None

    def ptr(t):
        return 0 if t is None else t.data_ptr()

    lib.pk_ep_unpack(meta.data_ptr(), received, meta.shape[1], rows, call.num_scales, k if with_ids else 0,
                     int(call.topk_dtype == torch.int64), int(bool(call.has_weights) and with_ids),
                     int(call.has_src), call.rank, call.per_rank, ptr(scales), ptr(idx), ptr(weights), ptr(counts),
                     ptr(src))
    return scales, idx, weights, counts, src


def combine_native(call: CombineInputs) -> torch.Tensor:
    op = COMBINE_ROWS.name
    lib = _lib(op)
    own, others = call.own.contiguous(), call.others
    in_rank = call.is_token_in_rank.contiguous()
    biases = [b.contiguous() for b in call.biases]
    num_tokens, num_ranks = in_rank.shape
    hidden, me, splits = own.shape[1], call.me, list(call.recv_splits)
    if len(splits) != num_ranks or own.shape[0] != splits[me] or others.shape != (sum(splits) - splits[me], hidden):
        raise _bug(op, f"rows {tuple(own.shape)} + {tuple(others.shape)} do not match the splits {splits}")
    if any(b.shape != (num_tokens, hidden) for b in biases):
        raise _bug(op, "a bias is not [num_tokens, hidden]")
    call.wait()  # the others' rows are read below (contiguous only after they arrived)
    others = others.contiguous()
    row = hidden * others.element_size()
    blocks, at = [], others.data_ptr()
    for d, n in enumerate(splits):
        if d == me:
            blocks.append(own.data_ptr())
        else:
            blocks.append(at)
            at += n * row
    out = torch.empty((num_tokens, hidden), dtype=own.dtype)
    block_ptrs = torch.tensor(blocks, dtype=torch.int64)
    split_counts = torch.tensor(splits, dtype=torch.int64)
    bias_ptrs = _ptrs(biases)
    bias_bf16 = torch.tensor([int(b.dtype == torch.bfloat16) for b in biases] or [0], dtype=torch.int32)
    status = lib.pk_ep_combine(in_rank.data_ptr(), num_tokens, num_ranks, me, block_ptrs.data_ptr(),
                               split_counts.data_ptr(), hidden, len(biases), bias_ptrs.data_ptr(),
                               bias_bf16.data_ptr(), out.data_ptr(), num_threads())
    if status != 0:
        raise _bug(op, f"is_token_in_rank does not count the returned rows {splits}")
    return out


# -- providers ---------------------------------------------------------------------------------------

def _available(call) -> list[str]:
    return [] if LIB.get() is not None else [f"native EP row passes unavailable: {LIB.reason()}"]


def _combine_check(call) -> list[str]:
    reasons = _available(call)
    if call.own.dtype != torch.bfloat16:
        reasons.append(f"the native combine sums bf16 rows, not {call.own.dtype}")
    if any(b.dtype != call.own.dtype for b in call.biases):
        reasons.append("a bias of another dtype than the rows")
    return reasons


def register(registry) -> None:
    for contract, reference in ((PACK_DISPATCH_ROWS, pack_reference), (UNPACK_DISPATCH_META, unpack_reference),
                                (COMBINE_ROWS, combine_reference)):
        registry.kernel(contract.name, BACKEND, REFERENCE_PROVIDER, devices=("cpu",),
                        doc="the Buffer's torch code (portable_kernels.ops.ep.rows)")(reference)
    registry.kernel(PACK_DISPATCH_ROWS.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): rows and metadata rows in one pass, destination-major")(pack_native)
    registry.kernel(UNPACK_DISPATCH_META.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_available,
                    doc="C++ (deepjit): metadata rows to scales, local ids, weights, counts, source indices")(
        unpack_native)
    registry.kernel(COMBINE_ROWS.name, BACKEND, NATIVE, priority=10, devices=("cpu",), check=_combine_check,
                    doc="C++ (deepjit): each token's bf16 rows added in fp32 in one pass, rounded once")(
        combine_native)
