"""Backends that run kernel IR: the `Backend` protocol (base.py) and the numpy `sim` (sim.py).

Kept light: backends are imported from their own modules (`cuda` needs pycuda).
"""
