"""portable_kernels: semantic ops with one math contract, native kernels per chip."""
