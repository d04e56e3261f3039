"""The nvidia backend's providers, one module per op family, each with `register(registry)`.

Every family registers its Triton kernels ("triton", from ../kernels) and, where a vendor library
implements the contract, that library's provider (torch's cuBLASLt/CUTLASS ops, DeepGEMM,
FlashMLA, DeepSelect, from ../vendor). Nothing here imports Triton or a vendor package: each
provider imports its kernel on first call, and declines with the reason when the package is
missing or cannot run on the call's device.
"""
