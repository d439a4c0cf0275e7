"""Build: rendered kernels -> files on disk. Returns paths; never loads or runs what it builds.

  procs.py      child processes in their own process group, stopped as a group (timeouts, Ctrl-C)
  toolchain.py  tool lookup with install hints, one subprocess call with a one-line error, digests,
                atomic writes
  cpu.py        host shared objects, static aarch64 harnesses, sanitized executables
  opencl.py     the OpenCL host harness (built once per source text, cached)
"""
