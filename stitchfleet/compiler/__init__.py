"""The stitching compiler: graph IR -> clusters -> stitch plan -> kernel IR -> backends.

Pure: imports no TensorFlow, SQL, Prometheus or Kubernetes library and nothing else
of stitchfleet, so it runs on a GPU machine that has no TensorFlow. It returns data
(a CompileReport); it never logs to a database.
"""
