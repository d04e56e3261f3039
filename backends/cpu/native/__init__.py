"""The cpu backend's "native" providers: C++ kernels (one .cpp per op family, beside its Python
wrapper) compiled at first use through deepjit and cached; without a compiler they step aside and
the "reference" providers run (portable_kernels.native.build holds that rule)."""
