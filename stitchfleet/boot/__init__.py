"""The boot shim a job loads at interpreter start, and its installer.

Kept apart from plugin and operator: the shim runs inside the user's job, the
installer in the webhook's init container. Nothing here imports beyond the
standard library and stitchfleet.settings, so a job's startup stays cheap and safe.
"""
