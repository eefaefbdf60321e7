"""The TensorFlow side: session hook, GraphDef -> IR frontend, graph rewrite, guard, Horovod.

The only package that imports TensorFlow or Horovod, and only lazily, inside the
modules that need them. `stitchfleet.plugin.StitchHook` is resolved on first use
(importing this package does not import TensorFlow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stitchfleet.plugin.session.hook import StitchHook


def __getattr__(name: str) -> type[StitchHook]:
    if name == "StitchHook":
        from stitchfleet.plugin.session.hook import StitchHook

        return StitchHook
    raise AttributeError(f"module 'stitchfleet.plugin' has no attribute {name!r}")
