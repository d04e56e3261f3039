"""Triton kernels of the nvidia backend, one file per kernel, each with a Python launch function
of plain tensors and static values that validates its arguments before launching.

Triton is optional: nothing here is imported until `runtime.triton_status()` says Triton can run,
so a user without Triton gets the providers' reason, never an ImportError. Whether kernels run
compiled (cuda tensors) or in Triton's interpreter (CPU tensors, `TRITON_INTERPRET=1`) is fixed
when the first kernel module is imported; see runtime.py.
"""
