"""Which CPU kernel library TensorFlow runs in this process: oneDNN's (`_Mkl*` kernels, grappler's oneDNN
rewrites) or Eigen's. TF decides once, at import, from TF_ENABLE_ONEDNN_OPTS or, unset, from the CPU (on
by default only where it finds AVX-512 VNNI/BF16 or AMX): the same job differs between cluster nodes.
Output: `onednn()`; the rules that depend on it: docs/plugin/guard.md and docs/testing.md.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def onednn() -> bool:
    """Whether TF's CPU ops run oneDNN's kernels here (fixed for the process: TF reads the setting once)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TF without the module: no oneDNN build
        return False
    return bool(_pywrap_util_port.IsMklEnabled())
