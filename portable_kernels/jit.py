"""The library's one deepjit context: every backend that builds native code (C++, CUDA C++, Ascend
C) builds through `jit()`, so all of them share one build cache and one set of knobs
(`PK_JIT_CACHE_DIR`, `PK_JIT_VERBOSE`, ... then `DEEPJIT_*`; see docs/deepjit.md)."""

from __future__ import annotations

import deepjit

#: knob prefix of this library's JIT context
ENV_PREFIX = "PK_JIT_"

_CONTEXT = deepjit.JitContext(env_prefix=ENV_PREFIX)


def jit() -> deepjit.JitContext:
    """The shared JIT context."""
    return _CONTEXT
