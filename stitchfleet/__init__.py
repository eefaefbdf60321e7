"""stitchfleet: operator stitching (AStitch) for TensorFlow training fleets.

Importing the package loads nothing heavy: TensorFlow, pycuda, SQLAlchemy,
prometheus_client and kopf are imported lazily by the subpackages that own them,
so `import stitchfleet` works with only numpy installed.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
