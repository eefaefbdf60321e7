"""The hook in a job's session: `StitchHook`, auto-attach to MonitoredSession, threads, exports.

Input: the user's TF1 graph and session runs. Output: a stitched, guarded, timed training step, the
job untouched where stitching cannot help. The top of the plugin: it composes every other part.
"""
