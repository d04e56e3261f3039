"""Stand-in for `npu_format_cast` / `get_npu_format`: on an NPU the result keeps its logical ND shape and
carries the format internally ((beta) torch_npu.npu_format_cast: FRACTAL_NZ = 29, ND = 2); the stand-in
records the format id on a copy so a provider's call can be checked. Views (a transposed weight) carry
their base's format, as a view of an NPU tensor shares its storage."""

from __future__ import annotations

import weakref

from ._common import require

FORMATS = {2: "ND", 29: "FRACTAL_NZ"}


class FormatCast:
    def __init__(self, owner) -> None:
        self.owner = owner
        self._formats: dict[int, int] = {}

    def npu_format_cast(self, input, acl_format, customize_dtype=None, input_dtype=None):
        self.owner.record("npu_format_cast")
        require(acl_format in FORMATS, f"stand-in npu_format_cast: formats {FORMATS} only")
        out = input.clone()
        self._formats[id(out)] = (weakref.ref(out), acl_format)
        return out

    def get_npu_format(self, t):
        while t is not None:
            entry = self._formats.get(id(t))
            if entry is not None and entry[0]() is t:
                return entry[1]
            t = t._base
        return 2
