"""Which clusters a job gets: its graph compiled with the job's options, each cluster mapped and built or left.

Input: the user's graph at `begin`, the compiler's artifacts, the fleet's memory, the settings.
Output: the installed clusters (kernels and sites) and a decision with a reason for every other one.
"""
