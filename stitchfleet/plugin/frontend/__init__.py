"""TensorFlow graph -> stitchfleet IR: the frontend of the plugin.

Input: a `tf.Graph`, a `GraphDef` or a .pb/.pbtxt file (see `converter` and
`graphdef_file`, which import TensorFlow). Output: a `Conversion` (the IR graph, the
mapping between IR nodes and TF tensors, and what happened to every TF op, with a
reason for each op that did not become an IR op). This package module itself only
re-exports the TF-free result types, so importing it stays light.
"""

from stitchfleet.plugin.frontend.result import Conversion, Disposition, FrontendError, TensorRef

__all__ = ["Conversion", "Disposition", "FrontendError", "TensorRef"]
