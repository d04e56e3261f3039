"""Host C++ of portable_kernels, built at first use through deepjit (see build.py for the rule).

`build` owns the library's deepjit context, the ISA flags and the fallback rule; `pk_native.h` holds
the conversions every native source shares. Backends import from here (never from each other).
"""

from .build import (JIT, NativeLibrary, compiler_flags, detected_isa, isa, libraries, native_disabled, num_threads,
                    register_library)

__all__ = ["JIT", "NativeLibrary", "compiler_flags", "detected_isa", "isa", "libraries", "native_disabled",
           "num_threads", "register_library"]
