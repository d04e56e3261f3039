"""`deep_gemm.testing.utils`: the architecture query and the test decorators DeepGEMM's tests use."""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

from ..runtime import arch_major

__all__ = ["get_arch_major", "ignore_env", "test_filter"]


def get_arch_major() -> int:
    """9 or 10: the architecture the drop-in targets — use_backend("nvidia", arch=...) when forced,
    else the CUDA device's, else 9 (the cpu backend computes the SM90 conventions' bytes)."""
    return arch_major()


def test_filter(condition: Callable[[], bool]) -> Callable:
    """Run the decorated test only when condition() holds; otherwise print that it was filtered."""
    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return func(*args, **kwargs)
            print(f"{func.__name__}:\n > Filtered by {condition}\n")
            return None
        return wrapper
    return decorator


test_filter.__test__ = False  # a decorator, not a test, for pytest's collector


def ignore_env(name: str, condition: Callable[[], bool]) -> Callable:
    """While the decorated function runs with condition() true, the environment variable `name` is
    unset (and restored afterwards, also when the function raises)."""
    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved
        return wrapper
    return decorator
