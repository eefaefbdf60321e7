"""The launch library's C source and the non-finite check kernels, read from the package's `csrc/`.

Input: `csrc/launch.c` and `csrc/nonfinite_checks.cu` (package data). Output: `SOURCE`, the launch
library's one C99 translation unit (built by `launch_library.build`, hashed into its cache key and
the prebuilt library's name), and `CHECKS`, the CUDA text appended to every cluster's module.
What each call does and why is said in the files themselves.
"""

from __future__ import annotations

from importlib.resources import files

_CSRC = files(__package__).joinpath("csrc")
SOURCE = _CSRC.joinpath("launch.c").read_text(encoding="utf-8")
CHECKS = _CSRC.joinpath("nonfinite_checks.cu").read_text(encoding="utf-8")
