"""The CPU benchmark: stitched `cpu` code (C + OpenMP) against plain TensorFlow CPU on the same clusters.

Input/output: see the submodules (translate_tf, cases, report, command). Importing this
package is light: TensorFlow loads only when a run starts.
"""
