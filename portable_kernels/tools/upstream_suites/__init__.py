"""Run an upstream checkout's own test suite through the drop-ins (not part of CI: it needs the
upstream source). `python -m portable_kernels.tools.upstream_suites --deepgemm DIR --tilekernels DIR`.

engine.py copies, rewrites by listed rules, runs and counts; deepgemm.py and tilekernels.py hold
each library's rules. The result is an honest table: a failure is reported, never rewritten away.
"""
