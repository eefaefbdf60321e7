"""The stitching compiler: graph IR -> clusters (at frontend op granularity) -> stitch plan -> kernel IR -> targets.

Pure: imports no TensorFlow, SQL, Prometheus or Kubernetes library and nothing else
of stitchfleet but settings (the target names), so it runs on a GPU machine that has no
TensorFlow. It returns data (a CompileReport); it never logs to a database. Layers, lowest
first (import-linter and tests/test_house.py keep imports one way): ir, plan, kernel, lower,
targets (one folder per backend, found by name), pipeline, compile_command. Beside them,
clusters: scope.py (drawn from the graph) and granularity.py (redrawn along the frontend's ops,
from the origins a frontend such as the plugin's hands over). The pipeline runs every stage once,
one way; its callers (the plugin included) consume its artifacts and plan a cluster they change
only through `pipeline.compile_cluster`.
"""
