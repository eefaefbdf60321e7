"""The TensorFlow side: session hook, GraphDef -> IR frontend, graph rewrite, guard, Horovod.

The only package that imports TensorFlow or Horovod, and only lazily, inside the
modules that need them. `stitchfleet.plugin.StitchHook` is resolved on first use
(importing this package does not import TensorFlow).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "StitchHook":
        from stitchfleet.plugin.session.hook import StitchHook

        return StitchHook
    raise AttributeError(f"module 'stitchfleet.plugin' has no attribute {name!r}")
