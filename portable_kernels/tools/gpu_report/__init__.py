"""`python -m portable_kernels gpu-report`: a static report of the nvidia Triton kernels compiled
ahead of time for sm_90a / sm_100a (no GPU needed), and a gate on what it finds.

aot.py turns launches into compiles, specimens.py holds the launches, sass.py reads a cubin,
report.py builds the rows and the gate, roofline.py the bytes/FLOPs bounds; nothing here runs a kernel.
"""
