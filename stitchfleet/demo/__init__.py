"""`stitchfleet demo` and the training graphs it and the workload builders use (not part of the plugin).

Input: command-line arguments. Output: a small model trained with the plugin on, and its savings report.
"""
