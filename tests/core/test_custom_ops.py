"""The torch.library custom ops (`torch.ops.portable_kernels.*`): every public op has one, opcheck
passes for each on conformance-like inputs on cpu and on the nvidia backend in emulation, the op
computes what the public function computes, and the fakes build each Format's storage exactly."""

from __future__ import annotations

import ast
import contextlib
import inspect
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from functorch.compile import compiled_function, nop
from torch.library import opcheck
from torch.testing._internal.optests.generate_tests import DEFAULT_TEST_UTILS

import portable_kernels as pk
from portable_kernels import torch_ops
from portable_kernels.core.compiled import ROUTES
from portable_kernels.core.contract import _PUBLIC
from portable_kernels.core.formats import known_formats
from portable_kernels.layouts import LayoutConversionError
from portable_kernels.core.tensors import PreparedTensor, QuantTensor
from portable_kernels.torch_ops.fake_storage import fake_storage

from custom_op_cases import BACKENDS, CASES, OpCase, matrix

#: public ops that are not custom ops, and why (docs/custom-ops.md says the same)
NOT_CUSTOM_OPS = {
    "simulate_dispatch": "simulates R ranks in one process",
    "simulate_combine": "simulates R ranks in one process",
    "simulate_low_latency_dispatch": "simulates R ranks in one process",
    "simulate_low_latency_combine": "simulates R ranks in one process",
}

#: the arguments each op writes (declared `Tensor(x!)` in its schema)
MUTATED = {
    "fp8_gemm_nt": {"d"}, "bf16_gemm_nt": {"d"}, "fp8_fp4_gemm_nt": {"d"},
    "m_grouped_fp8_gemm_nt_contiguous": {"d"}, "m_grouped_fp8_gemm_nt_masked": {"d"},
    "m_grouped_bf16_gemm_nt_contiguous": {"d"}, "m_grouped_bf16_gemm_nt_masked": {"d"},
    "flash_mla_with_kvcache": {"out", "lse"}, "reduce_fused": {"out"},
    "swiglu_forward_and_per_token_cast": {"clamped_count"}, "swiglu_forward": {"clamped_count"},
    "top2_sum_gate": {"unmapped_topk_idx"}, "inplace_unique_group_indices": {"group_indices"},
    **{f"{kind}_gemm_{layout}": {"d"} for kind in ("fp8", "bf16") for layout in ("nn", "tn", "tt")},
    "m_grouped_fp8_fp4_gemm_nt_contiguous": {"d"}, "m_grouped_fp8_fp4_gemm_nt_masked": {"d"},
    "k_grouped_fp8_gemm_tn_contiguous": {"d"}, "k_grouped_fp8_gemm_nt_contiguous": {"d"},
    "k_grouped_bf16_gemm_tn_contiguous": {"d"}, "tf32_hc_prenorm_gemm": {"d", "sqr_sum"},
    # the mHC ops (ops/mhc) return fresh tensors and write none of their arguments
    **{f"mhc_{name}{kind}": set() for name in ("expand", "sinkhorn", "pre_split_mixes", "head_compute_mix",
                                                "pre_apply_mix", "post", "pre_norm_fn") for kind in ("", "_backward")},
}

_BYTE_FLOATS = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu)


@pytest.fixture
def byte_exact_allclose(monkeypatch: pytest.MonkeyPatch) -> None:
    """opcheck's schema check compares tensors with torch.allclose, which torch 2.13 does not
    implement for float8 dtypes on CPU; compare those bit for bit instead (stricter)."""
    allclose = torch.allclose

    def patched(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
        if a.dtype in _BYTE_FLOATS or b.dtype in _BYTE_FLOATS:
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        return allclose(a, b, *args, **kwargs)

    monkeypatch.setattr(torch, "allclose", patched)


@contextlib.contextmanager
def recording_ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, tuple]]]:
    """Record (op overload, arguments) of every custom-op call the routes make inside the block."""
    calls: list[tuple[Any, tuple]] = []
    real = torch_ops.boundary.op

    def recording(name: str) -> Any:
        target = real(name)

        def call(*args: Any) -> Any:
            calls.append((target, args))
            return target(*args)
        return call

    for module in (torch_ops.declare,):
        monkeypatch.setattr(module, "op", recording)
    yield calls


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor of a public op's result, in order (prepared and quantized values, mappings, metadata)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (PreparedTensor, QuantTensor)):
        return [value.data, value.scale]
    if isinstance(value, pk.MlaMetadata):
        return [*value.tensors, *_tensors(value.num_splits)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _same(a: Any, b: Any) -> bool:
    left, right = _tensors(a), _tensors(b)
    return len(left) == len(right) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8) if x.dtype in _BYTE_FLOATS else x,
                                                                  y.view(torch.uint8) if y.dtype in _BYTE_FLOATS else y)
        for x, y in zip(left, right))


def _describe(value: Any) -> Any:
    """The static attributes of a result (what the route rebuilds around the op's tensors)."""
    if isinstance(value, PreparedTensor):
        return ("prepared", value.format.name, value.backend, value.params, tuple(value.shape), value.granularity,
                value.storage_granularity, value.ue8m0, value.element)
    if isinstance(value, QuantTensor):
        return ("quant", value.granularity, value.ue8m0, value.element)
    if isinstance(value, pk.FusedMapping):  # the counts list is [] in a graph (reading it would end the graph)
        return ("mapping", *_describe(tuple(value[:7])))
    if isinstance(value, pk.MlaMetadata):
        return ("meta", value.backend, value.batch_size, value.num_q_tokens_per_head_k, value.num_heads_k,
                value.num_heads_q, value.is_fp8_kvcache, value.topk)
    if isinstance(value, (tuple, list)):
        return tuple(_describe(v) for v in value)
    return type(value).__name__


def test_every_public_op_is_a_custom_op() -> None:
    public = set(_PUBLIC)
    assert set(torch_ops.SCHEMAS) == set(ROUTES) == public - set(NOT_CUSTOM_OPS)
    for name in torch_ops.SCHEMAS:
        assert hasattr(torch.ops.portable_kernels, name)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_route_takes_the_public_signature(name: str) -> None:
    public, route = inspect.signature(_PUBLIC[name]), inspect.signature(ROUTES[name])
    assert [(p.name, p.kind, p.default) for p in route.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in public.parameters.values()]


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_public_function_forwards_every_argument_under_compile(name: str) -> None:
    fn = _PUBLIC[name]
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") ==
             "compiled_call"]
    assert len(calls) == 1, "the public function must start with: if is_compiling(): return compiled_call(...)"
    call = calls[0]
    forwarded = [a.value for a in call.args[:1]] + [a.id for a in call.args[1:]] + \
        [f"{k.arg}={k.value.id}" for k in call.keywords]
    params = inspect.signature(fn).parameters.values()
    assert forwarded == [name] + [p.name if p.kind != p.KEYWORD_ONLY else f"{p.name}={p.name}" for p in params]


def test_every_custom_op_has_cases() -> None:
    assert {c.op for c in CASES} == set(torch_ops.SCHEMAS)


@pytest.mark.parametrize("name", sorted(torch_ops.SCHEMAS))
def test_schema_declares_exactly_the_written_arguments(name: str) -> None:
    schema = getattr(torch.ops.portable_kernels, name).default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATED.get(name, set())
    assert all(r.alias_info is None for r in schema.returns)  # outputs never alias inputs


@pytest.mark.parametrize(("op_case", "backend"), matrix(), ids=[f"{c.id}-{b}" for c, b in matrix()])
def test_opcheck(op_case: OpCase, backend: str, monkeypatch: pytest.MonkeyPatch, byte_exact_allclose: None) -> None:
    name, options = BACKENDS[backend]
    with pk.use_backend(name, **options), warnings.catch_warnings():
        warnings.simplefilter("ignore", pk.ImplicitConversionWarning)
        args, kwargs = op_case.build(1234)
        eager = _PUBLIC[op_case.op](*args, **kwargs)
        args, kwargs = op_case.build(1234)  # the same inputs again, fresh output buffers
        with recording_ops(monkeypatch) as calls:
            routed = ROUTES[op_case.op](*args, **kwargs)
        assert [call[0]._name for call in calls] == [f"portable_kernels::{op_case.op}"]
        assert _describe(routed) == _describe(eager)
        assert _same(routed, eager), "the custom op computed something else than the public function"
        op, op_args = calls[0]
        utils = list(DEFAULT_TEST_UTILS)
        if not all(t.clone().stride() == t.stride() for t in _tensors(op_args)):
            # opcheck's AOT test clones every input, which drops the padding of TMA-aligned scales
            # (so the op rightly refuses them): run the AOT check on the inputs as they are instead
            utils.remove("test_aot_dispatch_dynamic")
            aot_check_keeping_strides(op, op_args)
        results = opcheck(op, op_args, test_utils=utils)
    assert set(results.values()) == {"SUCCESS"}, results


def _mutable(op: Any) -> list[int]:
    return [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def aot_check_keeping_strides(op: Any, args: tuple) -> None:
    """opcheck's test_aot_dispatch_dynamic without copying the inputs: the op traced by AOTAutograd
    (dynamic shapes, functionalized) gives the same outputs and writes as the op in eager mode."""
    written = _mutable(op)

    def run(call_args: list) -> list[torch.Tensor]:
        out = op(*call_args)
        return _tensors(out) + [call_args[i] for i in written if call_args[i] is not None]

    def fresh() -> list:  # clones of the written arguments only (they are dense)
        return [a.clone() if i in written and isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]

    tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def from_tensors(tensors: list[torch.Tensor], template: list) -> list[torch.Tensor]:
        full = list(template)
        for i, t in zip(tensor_at, tensors):
            full[i] = t
        return run(full)

    eager_args, compiled_args = fresh(), fresh()
    want = run(eager_args)
    compiled = compiled_function(lambda tensors: from_tensors(tensors, compiled_args), nop, nop, dynamic=True,
                                 keep_inference_input_mutations=True)
    got = compiled([compiled_args[i] for i in tensor_at])
    assert _same(got, want), "the op traced by AOTAutograd gives other results than in eager mode"


# -- fake storage ---------------------------------------------------------------------------------

def _surrogate(shape: tuple[int, ...], granularity: tuple[int, int], element: str) -> QuantTensor:
    """A logical operand with power-of-two scales (every Format can encode it)."""
    *lead, mn, k = shape
    scale_shape = (*lead, -(-mn // granularity[0]), -(-k // granularity[1]))
    scale = torch.full(scale_shape, 0.25)
    data = torch.zeros(*lead, mn, k // 2, dtype=torch.uint8) if element == "e2m1" else \
        torch.zeros(shape, dtype=torch.float8_e4m3fn)
    return QuantTensor(data, scale, granularity, True, element)


STORAGE_SHAPES = [(1, 128), (3, 300), (5, 64), (130, 512), (4, 32), (2, 5, 256), (3, 130, 96)]
STORAGE_GRANULARITIES = [(1, 128), (128, 128), (1, 32)]


IN_TREE_FORMATS = {fmt.name: fmt for fmt in (pk.PLAIN, pk.layouts.SM90, pk.layouts.SM100, pk.layouts.ASCEND_MX,
                                               pk.layouts.ASCEND_MX_NZ, pk.layouts.ASCEND_MX_KMAJOR,
                                               pk.layouts.ASCEND_BF16_VALUES, pk.layouts.ASCEND_BF16_VALUES_NZ,
                                               pk.layouts.ASCEND_FP32_VALUES)}


def test_every_in_tree_format_is_checked() -> None:
    from portable_kernels.backends.ascend import AscendBackend
    from portable_kernels.backends.nvidia import NvidiaBackend
    declared = {fmt.name for backend in (NvidiaBackend(), AscendBackend()) for fmt in backend.formats()}
    assert declared | {pk.PLAIN.name} <= set(IN_TREE_FORMATS)


@pytest.mark.parametrize("fmt_name", sorted(IN_TREE_FORMATS))
def test_fake_storage_matches_encode(fmt_name: str) -> None:
    fmt = IN_TREE_FORMATS[fmt_name]
    checked = 0
    for element in fmt.elements:
        for shape in STORAGE_SHAPES:
            for granularity in STORAGE_GRANULARITIES:
                if element == "e2m1" and (shape[-1] % 2 or granularity[0] != 1):
                    continue
                operand = _surrogate(shape, granularity, element)
                try:
                    real = fmt.encode(operand)
                except LayoutConversionError:
                    continue  # a granularity this Format cannot store
                fake = fake_storage(fmt, operand.data, shape, granularity)
                for got, want in zip(fake, real[:2]):
                    assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), \
                        (fmt_name, element, shape, granularity)
                checked += 1
    assert checked >= len(STORAGE_SHAPES)


def test_fake_storage_of_an_unknown_format_says_how_to_register_one() -> None:
    fmt = known_formats()["test-ue8m0-bytes"]  # defined by conftest, without fake storage
    with pytest.raises(pk.LayoutError, match="register_fake_storage"):
        fake_storage(fmt, torch.zeros(2, 128, dtype=torch.float8_e4m3fn), (2, 128), (1, 128))


# -- docs/custom-ops.md stays true ----------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "custom-ops.md"


def _collapsed(schema: str) -> str:
    for arg in ("a", "b", "x"):
        schema = schema.replace(torch_ops.boundary.operand_schema(arg), f"OPERAND {arg}")
    return schema


def test_doc_lists_every_schema() -> None:
    listed = re.search(r"```text\n(.*?)```", DOC.read_text(), flags=re.S).group(1).splitlines()
    assert listed == [_collapsed(torch_ops.SCHEMAS[name]) for name in sorted(torch_ops.SCHEMAS)]


def test_doc_snippets_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 2
    torch._dynamo.reset()
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"custom-ops.md block {i}", "exec"), {"__name__": "docs_custom_ops"})
    finally:
        torch._dynamo.reset()


# -- what the ops refuse --------------------------------------------------------------------------

def test_cast_refuses_bytes_of_another_backend_than_traced() -> None:
    x = torch.randn(4, 256)
    with pytest.raises(pk.LayoutError, match="traced for nvidia"):
        torch.ops.portable_kernels.per_token_cast_to_fp8(x, 128, True, "fp8_gemm_nt", "a", "nvidia",
                                                         pk.layouts.SM100.name, ["arch=sm100"])
    data, scale = torch.ops.portable_kernels.per_token_cast_to_fp8(x, 128, True, "fp8_gemm_nt", "a", "", "", [])
    assert data.shape == (4, 256) and scale.shape == (4, 2)


@pytest.mark.parametrize("backend", ["cpu", "nvidia-sm90"])
def test_op_validates_hand_built_prepared_bytes(backend: str) -> None:
    name, options = BACKENDS[backend]
    contract = pk.get_contract("fp8_gemm_nt")
    with pk.use_backend(name, **options):
        x, w = torch.randn(2, 256), torch.randn(64, 256)
        a = pk.per_token_cast_to_fp8(x, prepare_for="fp8_gemm_nt")
        b = pk.prepare_inputs("fp8_gemm_nt", b=pk.per_block_cast_to_fp8(w))["b"]
        good = list(torch_ops.operand_args(a, contract, "a"))
        rest = (*torch_ops.operand_args(b, contract, "b"), torch.empty(2, 64, dtype=torch.bfloat16), None, None)
        for _ in range(2):  # the first call checks the static attributes, later ones only the bytes
            torch.ops.portable_kernels.fp8_gemm_nt(*good, *rest)
        wrong_shape = list(good)
        wrong_shape[1] = good[1][:, :1].contiguous()
        with pytest.raises(pk.LayoutError, match="scale has shape"):
            torch.ops.portable_kernels.fp8_gemm_nt(*wrong_shape, *rest)
        if backend == "nvidia-sm90":  # the bytes of a TMA-aligned scale copied densely
            dense = list(good)
            dense[1] = good[1].clone()
            with pytest.raises(pk.LayoutError, match="not MN-major TMA-aligned"):
                torch.ops.portable_kernels.fp8_gemm_nt(*dense, *rest)
        unknown = list(good)
        unknown[2] = "no-such-format"
        with pytest.raises(pk.LayoutError, match="no byte format named"):
            torch.ops.portable_kernels.fp8_gemm_nt(*unknown, *rest)


def test_op_passes_contract_errors_through() -> None:
    a, b = torch.randn(2, 128, dtype=torch.bfloat16), torch.randn(64, 128, dtype=torch.bfloat16)
    with pytest.raises(pk.ContractError, match="argument 'd'"):
        torch.ops.portable_kernels.bf16_gemm_nt(a, b, torch.empty(2, 63, dtype=torch.bfloat16), None)


def test_eager_calls_do_not_go_through_the_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an eager call took the torch.compile route")

    for name in list(ROUTES):
        monkeypatch.setitem(ROUTES, name, refuse)
    x = torch.randn(4, 256)
    a = pk.per_token_cast_to_fp8(x, prepare_for="fp8_gemm_nt")
    b = pk.prepare_inputs("fp8_gemm_nt", b=pk.per_block_cast_to_fp8(torch.randn(64, 256)))["b"]
    pk.fp8_gemm_nt(a, b, torch.empty(4, 64, dtype=torch.bfloat16))
    pk.topk(x, 3)
