"""The cuda-cpu runtime's C++: the compatibility header and the launcher, read from the package's `csrc/`.

Input: `csrc/cuda_cpu.h`, `csrc/launcher.cc`, `csrc/race_check.cc` (package data). Output: `HEADER`,
put before the rendered kernels of a unit, `LAUNCHER`, put after them (it defines what the header
declares), and `RACE_CHECK`, the shared-memory race check race builds append;
`module.translation_unit` assembles them and hashes the whole text into the unit's cache key. The
execution model (fibers, barriers, warps, fill bytes) is described in `cuda_cpu.h` itself.
"""

from __future__ import annotations

from importlib.resources import files

_CSRC = files(__package__).joinpath("csrc")
HEADER = _CSRC.joinpath("cuda_cpu.h").read_text(encoding="utf-8")
LAUNCHER = _CSRC.joinpath("launcher.cc").read_text(encoding="utf-8")
RACE_CHECK = _CSRC.joinpath("race_check.cc").read_text(encoding="utf-8")  # race builds, after the launcher
