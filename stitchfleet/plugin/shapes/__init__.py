"""Shape signatures: the sizes a job really feeds, and native kernels per signature.

Input: the user's graph and each training step's feeds. Output: the job's signature, kernels compiled
in the background for the signatures it feeds and bound into the dispatch ops, and their lookups.
"""
