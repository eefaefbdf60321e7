"""What the hook decides, step by step: the schedule, probes, the slowdown guard, telemetry windows. TF-free.

Input: the installed clusters and per step what it gave (duration, checks, loss). Output: the switch
vector of the next step, keep/leave/revert decisions with their reasons, and window rows for the ledger.
"""
