"""Horovod ranks taking the same decisions: setup agreement and the per-step decision sums.

Input: each rank's installed clusters and its per-step figures. Output: what every rank agrees on,
summed over ranks, so every rank flips the same switches at the same step.
"""
