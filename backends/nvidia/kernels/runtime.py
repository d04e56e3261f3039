"""Where the nvidia Triton kernels can run in this process, decided without importing Triton.

Triton decides at decoration time (`@triton.jit`, i.e. when a kernel module is imported) whether a
kernel is compiled for the GPU or run by its interpreter on CPU tensors: its knob
`triton.knobs.runtime.interpret`, which reads the `TRITON_INTERPRET` environment variable unless set
in code. So the mode is fixed by the first import of a kernel
module and recorded here (`note_mode`); before that, `current_mode()` predicts it from the
environment. Compiled mode runs on cuda tensors only, interpreter mode on CPU tensors only.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from typing import Literal

import torch

INTERPRET_ENV = "TRITON_INTERPRET"
#: set to 0 to launch the GEMMs with one heuristic config instead of autotuning (faster first calls)
AUTOTUNE_ENV = "PK_TRITON_AUTOTUNE"
Mode = Literal["compiled", "interpreter"]

_fixed_mode: Mode | None = None


_autotune: bool | None = None


def autotune_enabled() -> bool:
    """Whether launchers autotune over their config sets (default yes; PK_TRITON_AUTOTUNE=0 or
    set_autotune(False) picks one config by a size heuristic: no tuning runs, fewer compiles)."""
    if _autotune is None:
        return os.environ.get(AUTOTUNE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
    return _autotune


def set_autotune(enabled: bool | None) -> None:
    """Force autotuning on or off for this process (None: follow PK_TRITON_AUTOTUNE again)."""
    global _autotune
    _autotune = enabled


def _env_interpret() -> bool:
    """Triton's own setting when Triton is already imported (its knob may have been set in code,
    `triton.knobs.runtime.interpret = True`), else the environment variable it reads."""
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get(INTERPRET_ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def note_mode(interpreting: bool) -> None:
    """Called once by kernels/_common.py when the kernels are decorated."""
    global _fixed_mode
    _fixed_mode = "interpreter" if interpreting else "compiled"


def current_mode() -> Mode:
    """The mode the kernels run in: fixed at the first kernel import, else predicted from the env."""
    if _fixed_mode is not None:
        return _fixed_mode
    return "interpreter" if _env_interpret() else "compiled"


@functools.lru_cache(maxsize=1)
def triton_missing_reason() -> str | None:
    """None when the `triton` package imports, else why the Triton providers are unavailable.

    Importing triton itself does not fix the run mode (only decorating a kernel does), so this
    probe may run before TRITON_INTERPRET is set; it runs at the first provider check.
    """
    if importlib.util.find_spec("triton") is None:
        return ("the triton package is not installed (pip install triton); the nvidia backend then runs its "
                "vendor providers or the layout-reference oracle")
    try:
        import triton  # noqa: F401
    except Exception as exc:  # a broken install is a reason, never an error for the user
        return f"the triton package failed to import ({type(exc).__name__}: {exc})"
    return None


def device_reason(device: torch.device) -> str | None:
    """None when Triton kernels can run on tensors of `device` in this process, else why not."""
    missing = triton_missing_reason()
    if missing is not None:
        return missing
    mode = current_mode()
    if device.type == "cuda":
        if mode == "interpreter":
            return (f"Triton runs in interpreter mode in this process ({INTERPRET_ENV}=1 when the kernels were "
                    "loaded); cuda tensors need compiled mode: unset it before the first nvidia kernel call")
        if not torch.cuda.is_available():
            return "torch.cuda is not available"
        return None
    if device.type == "cpu":
        if mode == "compiled":
            return (f"CPU tensors run the Triton kernels only in the interpreter: set {INTERPRET_ENV}=1 before the "
                    "first nvidia kernel call (emulation for tests; slow)")
        return None
    return f"Triton kernels run on cuda (or, interpreted, cpu) tensors, not on {device.type}"
