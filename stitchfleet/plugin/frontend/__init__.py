"""TensorFlow graph -> stitchfleet IR: the frontend of the plugin.

Input: a `tf.Graph`, a `GraphDef` or a .pb/.pbtxt file (see `converter` and `graphdef_file`, which import
TensorFlow). The rules in full: docs/plugin/frontend.md.
"""

from stitchfleet.plugin.frontend.result import Conversion, Disposition, FrontendError, TensorRef

__all__ = ["Conversion", "Disposition", "FrontendError", "TensorRef"]
