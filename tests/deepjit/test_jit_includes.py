"""Include tracking: header contents are part of the key, transitively, in include-dir order."""

from __future__ import annotations

from pathlib import Path

import pytest

import deepjit
from deepjit.key import MISSING, scan_includes

SOURCE = '#include "value.h"\nextern "C" int value() { return VALUE; }\n'


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def _value(jit: deepjit.JitContext, *dirs: Path, source: str = SOURCE) -> int:
    return jit.compile("inc", source, toolchain="host", kind="ctypes", include_dirs=list(dirs)).value()


def test_changed_header_content_changes_key_and_result(tmp_path):
    include = tmp_path / "inc"
    _write(include, "value.h", "#define VALUE 1\n")
    jit = deepjit.JitContext()
    key_before = jit.key("inc", SOURCE, toolchain="host", kind="ctypes", include_dirs=[include])
    assert _value(jit, include) == 1
    _write(include, "value.h", "#define VALUE 22\n")
    assert jit.key("inc", SOURCE, toolchain="host", kind="ctypes", include_dirs=[include]) != key_before
    assert _value(jit, include) == 22


def test_nested_header_change_is_tracked_transitively(tmp_path):
    include = tmp_path / "inc"
    _write(include, "value.h", '#include "detail/inner.h"\n#define VALUE INNER\n')
    _write(include / "detail", "inner.h", "#define INNER 3\n")
    jit = deepjit.JitContext()
    assert _value(jit, include) == 3
    _write(include / "detail", "inner.h", "#define INNER 4\n")
    assert _value(jit, include) == 4


def test_same_content_in_another_folder_keeps_the_key(tmp_path):
    for where in ("a", "b"):
        _write(tmp_path / where, "value.h", "#define VALUE 1\n")
    jit = deepjit.JitContext()
    keys = {jit.key("inc", SOURCE, toolchain="host", kind="ctypes", include_dirs=[tmp_path / w]) for w in "ab"}
    assert len(keys) == 1


def test_include_cycle_terminates_and_tracks_both_files(tmp_path):
    include = tmp_path / "inc"
    _write(include, "a.h", '#pragma once\n#include "b.h"\n#define VALUE 7\n')
    _write(include, "b.h", '#pragma once\n#include "a.h"\n')
    scan = scan_includes('#include "a.h"\n', [include])
    assert [spelling for spelling, _ in scan.records] == ["a.h", "b.h", "a.h"]
    assert _value(deepjit.JitContext(), include, source=SOURCE.replace("value.h", "a.h")) == 7


def test_missing_header_is_recorded_and_its_creation_changes_the_key(tmp_path):
    include = tmp_path / "inc"
    include.mkdir()
    jit = deepjit.JitContext()
    assert scan_includes(SOURCE, [include]).records == (("value.h", MISSING),)
    with pytest.raises(deepjit.CompileError) as failure:
        _value(jit, include)
    assert "value.h" in failure.value.output
    _write(include, "value.h", "#define VALUE 9\n")
    assert _value(jit, include) == 9


def test_include_dir_order_decides_which_header_counts(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _write(first, "value.h", "#define VALUE 1\n")
    _write(second, "value.h", "#define VALUE 2\n")
    jit = deepjit.JitContext()
    assert _value(jit, first, second) == 1
    assert _value(jit, second, first) == 2


def test_system_headers_in_angle_brackets_are_not_tracked(tmp_path):
    scan = scan_includes("#include <vector>\n#include <cstdint>\n", [tmp_path])
    assert scan.records == ()


def test_angle_include_found_in_include_dirs_is_tracked(tmp_path):
    _write(tmp_path, "mine.h", "int x;\n")
    assert [s for s, _ in scan_includes("#include <mine.h>\n", [tmp_path]).records] == ["mine.h"]


def test_header_added_to_an_earlier_include_dir_is_noticed_in_process(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    _write(second, "value.h", "#define VALUE 2\n")
    jit = deepjit.JitContext()
    assert _value(jit, first, second) == 2
    _write(first, "value.h", "#define VALUE 1\n")
    assert _value(jit, first, second) == 1
