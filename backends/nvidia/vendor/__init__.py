"""Vendor providers of the nvidia backend: calls into torch's cuBLASLt / CUTLASS paths and
delegation to DeepGEMM, FlashMLA and DeepSelect when those packages are importable.

None of these can run without a GPU, and none has run on one yet: each module keeps the building
of the call's arguments in pure functions (tested on CPU tensors, against a model of the callee's
documented rules where the callee itself cannot run on CPU) apart from the call itself, and says
why it declines (`reasons`) so the Triton kernels or the layout oracle take over.
"""
