"""The GPU runner: our programs on the cuda backend over torch allocations, timed with CUDA events.

Input: `Program`s and host inputs. Output: timing `Variant`s (stitch, per_op, JAX jit,
torch.compile), the device's copy bandwidth (`dst.copy_(src)`), and references for the
correctness check. Needs torch with CUDA and pycuda (JAX optional).

- Memory: every value is a torch tensor (bf16 has the same bits as our kernels' 16-bit
  patterns); our kernels get their data pointers. pycuda and torch share the device's
  primary context; our launches go to the legacy default stream, which is torch's
  default stream too (checked), so torch events order with them.
- Compilation: every kernel of a program is built in parallel first (`CudaBackend.prebuild`,
  one nvcc per core); the cubin cache keeps them for the next run on the machine.
- Timing: before each sample a 256 MiB buffer is zeroed (the L2 holds nothing of the
  case), the device is synchronised, then a start event, `reps` calls, the variant's
  wait (JAX runs on its own stream: `block_until_ready` on the host), an end event.
- References: `evaluate` on the host (native and float64) up to `check_max_bytes` of IO;
  above it the torch translation on the GPU, eager, native and float64 (the tests show
  it computes what `evaluate` does), since numpy float64 over gigabytes takes minutes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from benchmarks.harness import frameworks
from benchmarks.harness.programs import Program
from benchmarks.harness.timing import Variant
from benchmarks.harness.translate_torch import DTYPES, to_torch
from stitchfleet.compiler.evaluate import evaluate
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.targets.cuda.driver import CudaBackend

Array = npt.NDArray[Any]
FLUSH_BYTES = 256 << 20


class GpuRunner:
    """See the module docstring."""

    clock = "CUDA events (torch.cuda.Event), L2 flushed before each sample"

    def __init__(self, cache_dir: Path | None = None, torch_backend: str = "inductor") -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device: the GPU harness needs one (use --dry-run on a CPU machine)")
        if torch.cuda.current_stream().cuda_stream != 0:
            raise RuntimeError("torch's current stream is not the legacy default stream that our launches use")
        self.backend = CudaBackend(cache_dir)
        self.torch_backend = torch_backend
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    @property
    def device_name(self) -> str:
        return str(torch.cuda.get_device_name())

    def tensors(self, graph: Graph, inputs: Mapping[str, Array]) -> dict[str, torch.Tensor]:
        return frameworks.torch_tensors(graph, inputs, "cuda")

    def program(self, program: Program, graph: Graph, inputs: Mapping[str, Array]) -> Variant:
        values: dict[str, torch.Tensor] = {f"in:{n}": t for n, t in self.tensors(graph, inputs).items()}
        for name, (shape, dtype) in program.values.items():
            if name not in values:
                values[name] = torch.empty(shape, dtype=DTYPES[dtype], device="cuda")
        self.backend.prebuild([k for step in program.steps for k in step.kernels], workers=os.cpu_count() or 4)
        keep: list[torch.Tensor] = []
        bound: list[tuple[Any, dict[str, int]]] = []
        for step in program.steps:
            compiled = self.backend.compile(step.kernels)
            named = {buf: values[v] for buf, v in (*step.inputs, *step.outputs)}
            for name, buf in compiled.layout.items():  # scratch, partials, persistent temporaries
                if name not in named:
                    named[name] = torch.zeros(max(buf.size * buf.dtype.itemsize, 1), dtype=torch.uint8, device="cuda")
            keep += named.values()
            bound.append((compiled, {name: t.data_ptr() for name, t in named.items()}))

        def call() -> object:
            for compiled, pointers in bound:
                compiled.launch(pointers)
            return None

        def read() -> dict[str, Array]:
            torch.cuda.synchronize()
            return {n: frameworks.torch_host(values[v]) for n, v in program.outputs}

        return Variant(program.name, call, lambda _: None, read, program.kernel_count)

    def frameworks(self, graph: Graph, inputs: Mapping[str, Array]) -> list[Variant | None]:
        tensors = self.tensors(graph, inputs)
        return [frameworks.jax_variant(graph, inputs), frameworks.torch_variant(graph, tensors, self.torch_backend)]

    def sample(self, variant: Variant, reps: int) -> float:
        self.flush.zero_()
        torch.cuda.synchronize()
        self.start.record()
        out: object = None
        for _ in range(reps):
            out = variant.call()
        variant.finish(out)
        self.end.record()
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end)) / 1e3 / reps

    def copy_bandwidth(self, nbytes: int = 4 << 30, runs: int = 30) -> dict[str, float]:
        """Device-to-device copy, bytes read plus written over the median time."""
        src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = []
        for _ in range(runs):
            torch.cuda.synchronize()
            self.start.record()
            dst.copy_(src)
            self.end.record()
            self.end.synchronize()
            times.append(self.start.elapsed_time(self.end) / 1e3)
        median = float(np.median(times))
        del src, dst
        torch.cuda.empty_cache()
        return {"bytes": float(2 * nbytes), "median_s": median, "gbps": 2 * nbytes / median / 1e9}

    def references(
        self, graph: Graph, inputs: Mapping[str, Array], check_max_bytes: int, io: int
    ) -> tuple[str, dict[str, Array], dict[str, Array]]:
        if io <= check_max_bytes:
            return "evaluate", evaluate(graph, inputs), evaluate(graph, inputs, "float64")
        tensors = self.tensors(graph, inputs)
        with torch.no_grad():
            native = {n: frameworks.torch_host(v) for n, v in to_torch(graph)(tensors).items()}
            wide = {n: v.double() if v.is_floating_point() else v for n, v in tensors.items()}
            reference = {n: frameworks.torch_host(v) for n, v in to_torch(graph, "float64")(wide).items()}
        return "torch_fp64_on_gpu", native, reference
