"""The fixed CUDA C every rendered kernel starts with, read from the package's `prelude.cuh`.

Input: nothing (package data). Output: `PRELUDE`, the text of device helpers the renderer calls by
name (all prefixed `sf_`); what each does and why is said in the file itself.
"""

from __future__ import annotations

from importlib.resources import files

PRELUDE = files("stitchfleet.compiler.targets.cuda").joinpath("prelude.cuh").read_text(encoding="utf-8")
