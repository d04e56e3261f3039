"""The cpu backend's providers, one module per op family, each with `register(registry)`:
"native" C++ kernels (their sources in ../kernels/, compiled at first use through deepjit and
cached; without a compiler, or when a build fails, each declines with the reason and "reference"
runs — portable_kernels.core.native.build holds that rule and the one warning), and the in-process
EP simulation (ep.py)."""
