"""The framework baselines as timing `Variant`s: JAX jit (XLA fusion) and torch.compile (Inductor).

Input: a graph, host inputs (numpy, bf16 held in float32 as `evaluate` holds it), and
for torch the device and the compile backend. Output: a `Variant`, or None when the
framework is not installed (the caller records that). Inputs are converted once,
outside the timed calls; bf16 values round to nearest even, as `round_bf16` does, so
every variant sees the same numbers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.harness.timing import Variant
from stitchfleet.compiler.ir import Graph

Array = npt.NDArray[Any]


def available(module: str) -> bool:
    """Whether `module` can be imported here (without importing it: jax and torch take seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _jax_host(value: Any) -> Array:
    """A JAX array back on the host as evaluate holds it (bf16 widened to float32)."""
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def torch_host(value: Any) -> Array:
    """A tensor back on the host as evaluate holds it (bf16 widened to float32)."""
    import torch

    tensor = value.detach()
    host: Array = (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).cpu().numpy()
    return host


def jax_variant(graph: Graph, inputs: Mapping[str, Array]) -> Variant | None:
    """`jax.jit` of the translated graph on JAX's default device (the GPU where JAX has one)."""
    if not available("jax"):
        return None
    import jax

    from benchmarks.harness.translate_jax import dtype_of, to_jax

    params = {str(p.attrs["name"]): p.dtype for p in graph.parameters}
    args = {n: jax.device_put(np.asarray(v)).astype(dtype_of(params[n])) for n, v in inputs.items()}
    fn = jax.jit(to_jax(graph))
    state: dict[str, Any] = {}

    def call() -> object:
        state["out"] = fn(args)
        return state["out"]

    def read() -> dict[str, Array]:
        return {n: _jax_host(v) for n, v in state["out"].items()}

    return Variant("jax_jit", call, jax.block_until_ready, read)


def torch_tensors(graph: Graph, inputs: Mapping[str, Array], device: str) -> dict[str, Any]:
    """Host inputs as torch tensors of the parameters' dtypes on `device`."""
    import torch

    from benchmarks.harness.translate_torch import dtype_of

    params = {str(p.attrs["name"]): p.dtype for p in graph.parameters}
    return {n: torch.from_numpy(np.ascontiguousarray(v)).to(device).to(dtype_of(params[n])) for n, v in inputs.items()}


def torch_variant(graph: Graph, tensors: Mapping[str, Any], backend: str = "inductor") -> Variant | None:
    """`torch.compile` of the translated graph (dynamo cache reset first: every case compiles afresh)."""
    if not available("torch"):
        return None
    import torch

    from benchmarks.harness.translate_torch import to_torch

    torch._dynamo.reset()
    fn = torch.compile(to_torch(graph), backend=backend, dynamic=False, fullgraph=True)
    state: dict[str, Any] = {}

    def call() -> object:
        state["out"] = fn(tensors)
        return state["out"]

    def read() -> dict[str, Array]:
        return {n: torch_host(v) for n, v in state["out"].items()}

    return Variant("torch_compile", call, lambda _: None, read)
