"""The sim target: kernel IR interpreted in numpy (exact, slow, runs anywhere; the reference).

Input: a program (kernels in launch order, interpreter.py) or a cluster and its plan
(target.py: lowered, then interpreted). Output: the output buffers or the cluster's outputs.
interpreter.py runs launches (threads as numpy lanes, barriers per phase), memory.py holds
global/shared memory and atomics, numerics.py the float rules (bf16 rounding, libm). The
program checks other targets share (`buffer_layout`, `verify_program`) live in interpreter.py.
"""

from stitchfleet.compiler.devices import WARP
from stitchfleet.compiler.targets.base import Profile

PROFILE = Profile("sim", runs_on="cpu", warp=WARP, summary="kernels on the sim")
