"""The plugin's view of TF graphs: clusters mapped onto ops, the twin, rewrite, fallback functions.

Input: a `tf.Graph` before it is finalized and the compiler's cluster graphs. Output: sites (where a
cluster lives), the twin copy with a dispatch op per cluster, graph walks, placement, training steps.
"""
