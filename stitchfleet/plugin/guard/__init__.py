"""The numeric guard: each cluster judged against an fp64 reference, before install and on check steps.

Input: a cluster's IR, the values its inputs had and what TF's ops and the kernel computed. Output:
findings (error against allowance) that keep, or revert, a cluster.
"""
