"""Renderers: kernel IR -> source code for a backend (CUDA C now, C + OpenMP later).

Kept light: import the renderer modules themselves (`render.cuda`).
"""
