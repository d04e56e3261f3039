"""Host toolchain end to end: a pybind11 module and a ctypes library, built, loaded and called."""

from __future__ import annotations

import array
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import deepjit

pytest.importorskip("pybind11", reason="kind='pybind11' needs pybind11 (pip install -e '.[test]')")

MODULE = deepjit.Template(r"""
#include <pybind11/pybind11.h>
#include <cstdint>
#include <omp.h>
namespace py = pybind11;

constexpr int kTile = ${TILE};

int add(int a, int b) { return a + b; }

void scale(py::buffer buffer, float factor) {
    py::buffer_info info = buffer.request(true);
    if (info.format != py::format_descriptor<float>::format() || info.ndim != 1)
        throw std::invalid_argument("scale: expected a 1-D float32 buffer");
    float* data = static_cast<float*>(info.ptr);
    for (py::ssize_t i = 0; i < info.shape[0]; ++i) data[i] *= factor;
}

double sum_pointer(std::uintptr_t address, std::int64_t n) {
    const float* data = reinterpret_cast<const float*>(address);
    double total = 0;
    #pragma omp parallel for reduction(+ : total)
    for (std::int64_t i = 0; i < n; ++i) total += data[i];
    return total;
}

PYBIND11_MODULE(DEEPJIT_MODULE_NAME, m) {
    m.def("add", &add);
    m.def("scale", &scale);
    m.def("sum_pointer", &sum_pointer);
    m.def("tile", [] { return kTile; });
    m.def("max_threads", [] { return omp_get_max_threads(); });
}
""")
FLAGS = ["-O3", "-fopenmp"]


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pybind11-cache")


@pytest.fixture(scope="module")
def context(module_cache) -> deepjit.JitContext:
    return deepjit.JitContext(environ={"DEEPJIT_CACHE_DIR": str(module_cache), "PATH": os.environ["PATH"]})


@pytest.fixture(scope="module")
def module(context):
    return context.compile("pk_test_module", MODULE.render(TILE=128), toolchain="host", kind="pybind11", flags=FLAGS)


def test_pybind11_function_is_called(module):
    assert module.add(40, 2) == 42
    assert module.__name__ == "pk_test_module"


def test_pybind11_module_takes_a_buffer_in_place(module):
    values = array.array("f", [1.0, 2.0, 3.0])
    module.scale(values, 2.0)
    assert list(values) == [2.0, 4.0, 6.0]


def test_pybind11_module_reads_through_a_data_pointer(module):
    values = (ctypes.c_float * 1000)(*range(1000))
    assert module.sum_pointer(ctypes.addressof(values), 1000) == sum(range(1000))


def test_pybind11_module_reads_a_torch_tensor_by_pointer(module):
    torch = pytest.importorskip("torch")
    tensor = torch.arange(4096, dtype=torch.float32)
    assert module.sum_pointer(tensor.data_ptr(), tensor.numel()) == float(tensor.double().sum())


def test_openmp_is_linked(module):
    assert module.max_threads() >= 1


def test_template_parameter_reaches_the_module(module):
    assert module.tile() == 128


def test_pybind11_bad_argument_raises_instead_of_crashing(module):
    with pytest.raises(ValueError, match="1-D float32"):
        module.scale(array.array("d", [1.0]), 2.0)


def test_disk_hit_in_a_fresh_process_loads_the_module(module, module_cache):
    script = (
        "import json, deepjit\n"
        "from test_jit_host import MODULE, FLAGS\n"
        "a = deepjit.build('pk_test_module', MODULE.render(TILE=128), toolchain='host', kind='pybind11', flags=FLAGS)\n"
        "m = deepjit.compile('pk_test_module', MODULE.render(TILE=128), toolchain='host', kind='pybind11', flags=FLAGS)\n"
        "print(json.dumps([a.origin, m.add(1, 2)]))\n"
    )
    env = {**os.environ, "DEEPJIT_CACHE_DIR": str(module_cache), "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["disk", 3]


def test_ctypes_library_with_openmp_is_built_and_called(tmp_path):
    source = r"""
    #include <omp.h>
    extern "C" long long triangle(long long n) {
        long long total = 0;
        #pragma omp parallel for reduction(+ : total)
        for (long long i = 1; i <= n; ++i) total += i;
        return total;
    }
    """
    lib = deepjit.JitContext().compile("tri", source, toolchain="host", kind="ctypes", flags=["-O2", "-fopenmp"])
    lib.triangle.restype = ctypes.c_longlong
    lib.triangle.argtypes = [ctypes.c_longlong]
    assert lib.triangle(100000) == 100000 * 100001 // 2
