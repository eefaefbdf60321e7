"""The launch library's host half against the fake CUDA driver: workload clusters end to end, and faults.

Not a test module: `test_fake_driver.py` runs it in a subprocess of its own (the fake becomes the
process's libcuda.so.1 for good) as `python -m tests.compiler.targets.cuda_cpu.fake_gpu CACHE REPORT
[LABEL ...]`; it writes a JSON report. Per cluster: its launch plan (`plan_launches`), its module source
built as a cuda-cpu image, `LaunchLibrary.program` on a stream, inputs in device layout, outputs and
scratch filled with 0xFF (declared to the fake as device memory, so a memset outside them is refused), two
runs each checked against `evaluate` and against the driver's call log (the barrier counter zeroed on the
stream before each cooperative launch, every launch on the given stream, context pushes and pops balanced);
the in-kernel non-finite flag read back from the program's mapped words (clear after a clean run, set by a
NaN input on a second program of the same cluster without touching the first's, clear again after the
host's reset and a clean run); the blame kernels (nothing blamed where TF's values are non-finite too,
blamed exactly where ours are NaN/Inf and TF's finite); the programs' destroy unloading each module and
freeing its pinned words (the fake's books back where they were). Then one cluster of each kind under each
injected failure, what the fake refuses that a GPU would punish, and a kernel past 48 KiB of dynamic shared
memory (`large_shared_memory`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import GraphBuilder
from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.plan import PlanOptions
from stitchfleet.compiler.targets.cache import ArtifactCache
from stitchfleet.compiler.targets.cuda.device_arrays import device_dtype, from_device, to_device
from stitchfleet.compiler.targets.cuda.launch_library import LaunchError, LaunchLibrary, Program
from stitchfleet.compiler.targets.cuda.launch_library import build as build_launcher
from stitchfleet.compiler.targets.cuda.launch_plan import LaunchPlan, plan_launches
from stitchfleet.compiler.targets.cuda.launch_source import SOURCE as LAUNCH_SOURCE
from stitchfleet.compiler.targets.cuda_cpu import fake_driver
from stitchfleet.compiler.targets.cuda_cpu.module import CudaCpuOptions, driver_image
from stitchfleet.compiler.targets.sim.interpreter import buffer_layout
from tests.compiler.targets.cuda.suite_kernels import LARGE_TILE, large_smem_kernel
from tests.compiler.targets.cuda_cpu.sweep import Case, design_rule, workload_cases, workload_slice
from tests.compiler.test_output_repeats import repeating

Array = npt.NDArray[Any]
STREAM = 0x5F0000  # a stream handle the fake maps to its primary context: the log shows it is passed through
RUNS = 2
_ADDRESS = re.compile(r"ptr=(0x[0-9a-f]+)")
_RESOLVED = re.compile(r'symbol\("(cu\w+)"')  # every driver call csrc/launch.c looks up


@dataclass
class ClusterReport:
    label: str
    kernels: int
    cooperative: int = 0
    runs: int = 0
    flag_checked: bool = False  # a NaN input reached a checked output: set, reset, clean run
    blamed: int = 0  # blame passes that found ours non-finite where TF's was finite (as expected)
    destroyed: int = 0  # programs whose destroy unloaded their module and freed their pinned words
    problems: list[str] = field(default_factory=list)


class Memory:
    """Host memory standing for device memory (a device pointer is a host address), 256-byte aligned, each
    buffer declared to the fake as device memory (what TF's allocator would have handed out)."""

    def __init__(self, driver: fake_driver.FakeDriver) -> None:
        self.driver = driver
        self.keep: list[Array] = []

    def garbage(self, nbytes: int) -> Array:
        raw = np.full(nbytes + 256, 0xFF, np.uint8)
        offset = (-raw.ctypes.data) % 256
        view: Array = raw[offset : offset + max(nbytes, 1)]
        self.keep.append(raw)
        self.driver.device_memory(view.ctypes.data, view.nbytes)
        return view

    def holding(self, data: Array) -> Array:
        view = self.garbage(data.nbytes)
        view[: data.nbytes] = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        return view


@dataclass
class Bound:
    """A loaded cluster with its device buffers."""

    case: Case
    lowered: Lowered
    plan: LaunchPlan
    program: Program
    inputs: list[Array]
    outputs: list[Array]
    scratch: Array | None
    host_inputs: dict[str, Array]

    @property
    def pointers(self) -> tuple[list[int], list[int], int]:
        scratch = self.scratch.ctypes.data if self.scratch is not None else 0
        return [a.ctypes.data for a in self.inputs], [a.ctypes.data for a in self.outputs], scratch

    def run(self, program: Program | None = None) -> None:
        """One step of `program` (default: its own) on these buffers."""
        (program or self.program).run(*self.pointers, STREAM)

    def results(self) -> dict[str, Array]:
        layout, graph = buffer_layout(self.lowered.kernels), self.case.graph
        by_output, got = dict(self.lowered.outputs), {}
        for name, memory, source in zip(self.plan.outputs, self.outputs, self.plan.passthrough, strict=True):
            if source >= 0:
                got[name] = self.host_inputs[self.plan.inputs[source]]
                continue
            buf = layout[by_output[name]]
            raw = memory[: buf.size * buf.dtype.itemsize].view(device_dtype(buf.dtype)).copy()
            got[name] = from_device(buf, raw).reshape(graph.node(dict(graph.outputs)[name]).shape)
        return got


_PLANNED: dict[str, tuple[Case, Lowered, LaunchPlan]] = {}


def planned(case: Case) -> tuple[Lowered, LaunchPlan]:
    """The case's lowered program and launch plan, made once per case object: the faults bind each case a
    dozen times, and rendering its kernels (in `plan_launches`) was most of the Python time of a bind."""
    known = _PLANNED.get(case.label)
    if known is None or known[0] is not case:
        lowered = case.lowered()
        known = _PLANNED[case.label] = (case, lowered, plan_launches(case.graph, lowered))
    return known[1], known[2]


def bind(
    library: LaunchLibrary, options: CudaCpuOptions, case: Case, memory: Memory, inputs: dict[str, Array]
) -> Bound:
    lowered, plan = planned(case)
    image = driver_image(plan.source, plan.kernels, options)
    program = library.program(image, plan, STREAM)
    layout, by_param = buffer_layout(lowered.kernels), dict(lowered.inputs)
    on_device = []
    for name in plan.inputs:
        buf = layout.get(by_param.get(name, ""))
        on_device.append(memory.holding(to_device(buf, inputs[name]) if buf is not None else np.asarray(inputs[name])))
    outputs, by_output = [], dict(lowered.outputs)
    for name, source, repeat in zip(plan.outputs, plan.passthrough, plan.repeats, strict=True):
        if source >= 0 or repeat >= 0:  # an input passed through; an earlier output's buffer (its value, stored once)
            outputs.append(on_device[source] if source >= 0 else outputs[repeat])
            continue
        buf = layout[by_output[name]]
        outputs.append(memory.garbage(buf.size * buf.dtype.itemsize))
    scratch = memory.garbage(plan.scratch_bytes) if plan.scratch_bytes else None
    return Bound(case, lowered, plan, program, on_device, outputs, scratch, inputs)


@dataclass(frozen=True)
class SpecShape:
    """What a spec asks of the driver (csrc/launch.c's layout): plain and cooperative launches, scratch
    ranges zeroed, and the checked outputs (index, elements, dtype code)."""

    plain: int
    cooperative: int
    zero_ranges: int
    checks: tuple[tuple[int, int, int], ...]


def spec_shape(spec: tuple[int, ...]) -> SpecShape:
    at, plain, cooperative, zeros = 6, 0, 0, 0
    for _ in range(spec[5]):
        barrier, params = spec[at + 3], spec[at + 4]
        cooperative += barrier
        plain += 1 - barrier
        at += 5 + 2 * params
        zeros += spec[at]
        at += 1 + 2 * spec[at]
    checks = tuple((spec[at + 1 + 3 * c], spec[at + 2 + 3 * c], spec[at + 3 + 3 * c]) for c in range(spec[at]))
    return SpecShape(plain, cooperative, zeros, checks)


def flag_words(program: Program) -> Any:
    """The program's two mapped flag words, as the op reads and resets them (no stream sync)."""
    return program.library.lib.sf_program_flags(program.handle)


def reset_flags(program: Program) -> None:
    words = flag_words(program)
    words[0] = words[1] = 0


def log_problems(log: list[str], bound: Bound) -> tuple[list[str], int]:
    """What the call log of one run shows wrong, and how many cooperative launches it had."""
    found, cooperative, zeroed = [], 0, set()
    counter = None
    if bound.plan.spec[4] >= 0 and bound.scratch is not None:
        counter = bound.scratch.ctypes.data + bound.plan.spec[4]
    for line in log:
        if line.startswith("!"):
            found.append(f"driver refused: {line}")
        if line.startswith("cuMemsetD32Async"):
            match = _ADDRESS.search(line)
            if match and "value=0 words=1" in line:
                zeroed.add(int(match.group(1), 16))
        if line.startswith(("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuMemset")) and (
            f"stream={hex(STREAM)}" not in line
        ):
            found.append(f"not on the given stream: {line}")
        if line.startswith("cuLaunchCooperativeKernel"):
            cooperative += 1
            if counter is None or counter not in zeroed:
                found.append(f"barrier counter not zeroed on the stream before: {line}")
            zeroed.discard(counter or 0)
    return found, cooperative


def checked_names(plan: LaunchPlan) -> list[str]:
    """The outputs the program checks (floating, computed, not passed through), by name."""
    return [plan.outputs[j] for j, elements, _ in spec_shape(plan.spec).checks if elements > 0]


def carries_nonfinite(plan: LaunchPlan, want: dict[str, Array]) -> bool:
    """Whether an output the program checks is NaN or infinite in `want`."""
    return any(not np.isfinite(np.asarray(want[name], np.float64)).all() for name in checked_names(plan))


def _blamable(plan: LaunchPlan, ours: dict[str, Array], theirs: dict[str, Array]) -> bool:
    """What the blame kernels must find: a checked output NaN/Inf in `ours` where `theirs` is finite."""
    return any(
        bool((~np.isfinite(np.asarray(ours[n], np.float64)) & np.isfinite(np.asarray(theirs[n], np.float64))).any())
        for n in checked_names(plan)
    )


def _refused(log: list[str]) -> list[str]:
    return [f"driver refused: {line}" for line in log if line.startswith("!")]


def drive(driver: fake_driver.FakeDriver, library: LaunchLibrary, options: CudaCpuOptions, case: Case) -> ClusterReport:
    driver.forget_device_memory()
    books = driver.books
    memory = Memory(driver)
    inputs = random_inputs(case.graph, case.seed)
    bound = bind(library, options, case, memory, inputs)
    report = ClusterReport(case.label, len(bound.plan.kernels))
    if bound.program.flags() != (0, 0):
        report.problems.append(f"the flag words start as {bound.program.flags()}, not zeroed (pinned memory is 0xFF)")
    want = evaluate(case.graph, inputs)
    wide = evaluate(case.graph, inputs, "float64")
    for _ in range(RUNS):
        driver.reset()
        bound.run()
        found, cooperative = log_problems(driver.log(), bound)
        report.problems += found
        report.cooperative += cooperative
        pushes, pops, depth = driver.balance
        if pushes != pops or depth != 0:
            report.problems.append(f"context pushes {pushes}, pops {pops}, depth {depth} after a run")
        output_checks = design_rule(case.graph, inputs, bound.results(), want, wide)
        report.problems += [f"{name}: {v.reason}" for name, v in output_checks.items() if not v.ok]
        report.runs += 1
    expected = (int(carries_nonfinite(bound.plan, want)), 0)
    if bound.program.flags() != expected:
        report.problems.append(f"the flag words read {bound.program.flags()}, the reference says {expected}")
    reset_flags(bound.program)
    programs = [bound.program]
    poisoned = _poisoned(driver, library, options, case, memory=memory, clean=bound, want=want, report=report)
    if poisoned is not None:
        programs.append(poisoned.program)
    _destroy(driver, programs, books, report)
    return report


def _poisoned(
    driver: fake_driver.FakeDriver,
    library: LaunchLibrary,
    options: CudaCpuOptions,
    case: Case,
    *,
    memory: Memory,
    clean: Bound,
    want: dict[str, Array],
    report: ClusterReport,
) -> Bound | None:
    """A NaN in the first float input, run by a second program of the same cluster: when `evaluate` carries it
    to a checked output, that program's flag is set and the first program's stays clear (each module has its
    own `sf_nonfinite_flag`); the blame kernels then find nothing against its own outputs (non-finite on both
    sides) and exactly what numpy finds against the clean run's outputs; after the host's reset, a clean run
    of the same program leaves the flag as the reference says. None when no checked output would carry it."""
    floats = [name for name, v in clean.host_inputs.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    if not floats:
        return None
    inputs = dict(clean.host_inputs)
    inputs[floats[0]] = np.full_like(np.asarray(inputs[floats[0]]), np.nan)
    if not carries_nonfinite(clean.plan, evaluate(case.graph, inputs)):
        return None
    other = bind(library, options, case, memory, inputs)
    driver.reset()
    other.run()
    report.problems += _refused(driver.log())
    if other.program.flags() != (1, 0):
        report.problems.append(f"a NaN output left the flag words at {other.program.flags()}, not (1, 0)")
    if clean.program.flags() != (0, 0):
        report.problems.append("the second program's kernels set the first program's flag (a shared global)")
    mine, clean_outputs = [a.ctypes.data for a in other.outputs], [a.ctypes.data for a in clean.outputs]
    driver.reset()
    other.program.blame(mine, mine, STREAM)
    if other.program.flags()[1] != 0:
        report.problems.append("blamed where TF's values are non-finite too")
    other.program.blame(mine, clean_outputs, STREAM)
    blamed, expected = other.program.flags()[1], int(_blamable(clean.plan, other.results(), clean.results()))
    if blamed != expected:
        report.problems.append(f"the blame word reads {blamed}, numpy says {expected}")
    report.blamed += blamed
    log = driver.log()
    report.problems += _refused(log)
    launches = [line for line in log if line.startswith("cuLaunchKernel sf_blame_")]
    if len(launches) != 2 * len(checked_names(clean.plan)):
        report.problems.append(f"{len(launches)} blame launches for {len(checked_names(clean.plan))} checked outputs")
    report.problems += [f"blame not on the given stream: {line}" for line in launches if hex(STREAM) not in line]
    reset_flags(other.program)
    driver.reset()
    clean.run(other.program)
    report.problems += _refused(driver.log())
    expected_flags = (int(carries_nonfinite(clean.plan, want)), 0)
    if other.program.flags() != expected_flags:
        report.problems.append(f"after the reset and a clean run the flags read {other.program.flags()}")
    wide = evaluate(case.graph, clean.host_inputs, "float64")
    output_checks = design_rule(case.graph, clean.host_inputs, clean.results(), want, wide)
    report.problems += [f"second program {n}: {v.reason}" for n, v in output_checks.items() if not v.ok]
    report.flag_checked = True
    return other


def _destroy(
    driver: fake_driver.FakeDriver, programs: list[Program], books: fake_driver.Books, report: ClusterReport
) -> None:
    """Closes the programs: each unloads its module and frees its pinned words in its own context, and the
    fake's books are back where they were before the cluster (no module or pinned allocation left)."""
    driver.reset()
    for program in programs:
        program.close()
    log = driver.log()
    report.problems += _refused(log)
    unloads = sum(line.startswith("cuModuleUnload") for line in log)
    frees = sum(line.startswith("cuMemFreeHost") for line in log)
    if unloads != len(programs) or frees != len(programs):
        report.problems.append(f"{len(programs)} programs destroyed with {unloads} unloads and {frees} frees")
    pushes, pops, depth = driver.balance
    if pushes != pops or depth != 0:
        report.problems.append(f"destroy: context pushes {pushes}, pops {pops}, depth {depth}")
    after = driver.books
    if (after.modules, after.pinned) != (books.modules, books.pinned):
        report.problems.append(f"leaked: {after} after destroy, {books} before the cluster")
    else:
        report.destroyed = len(programs)


BLAME_LOOKUP = -1  # nth: the first blame kernel's cuModuleGetFunction (after the cluster's kernels')
# (call to fail, CUresult, sticky, where it fires: "create", "run" or "blame", nth call of that name)
FAULTS = (
    ("cuModuleLoadData", fake_driver.OUT_OF_MEMORY, False, "create", 1),
    ("cuModuleGetFunction", fake_driver.NOT_FOUND, False, "create", 1),
    ("cuModuleGetFunction", fake_driver.NOT_FOUND, False, "create", BLAME_LOOKUP),
    ("cuFuncGetAttribute", fake_driver.INVALID_VALUE, False, "create", 1),
    ("cuCtxGetDevice", fake_driver.INVALID_VALUE, False, "create", 1),
    ("cuDeviceGetAttribute", fake_driver.INVALID_VALUE, False, "create", 1),
    ("occupancy 0", fake_driver.COOPERATIVE_LAUNCH_TOO_LARGE, False, "create", 1),  # the device holds no block
    ("cuMemHostAlloc", fake_driver.OUT_OF_MEMORY, False, "create", 1),
    ("cuMemHostGetDevicePointer", fake_driver.INVALID_VALUE, False, "create", 1),
    ("cuModuleGetGlobal", fake_driver.OUT_OF_MEMORY, False, "create", 1),
    ("cuMemcpyHtoD", fake_driver.ILLEGAL_ADDRESS, False, "create", 1),
    ("cuStreamGetCtx", fake_driver.INVALID_HANDLE, False, "run", 1),
    ("cuCtxPushCurrent", fake_driver.LAUNCH_FAILED, False, "run", 1),
    ("cuMemsetD8Async", fake_driver.LAUNCH_FAILED, True, "run", 1),
    ("cuMemsetD32Async", fake_driver.LAUNCH_FAILED, True, "run", 1),
    ("cuLaunchKernel", fake_driver.LAUNCH_OUT_OF_RESOURCES, False, "run", 1),
    ("cuLaunchKernel", fake_driver.LAUNCH_FAILED, True, "run", 1),
    ("cuLaunchCooperativeKernel", fake_driver.ILLEGAL_ADDRESS, True, "run", 1),
    ("cuLaunchKernel", fake_driver.LAUNCH_FAILED, False, "blame", 1),
)


def _applies(call: str, where: str, nth: int, shape: SpecShape) -> bool:
    """Whether this cluster's program makes the call the fault hits."""
    if call in {"cuLaunchCooperativeKernel", "cuMemsetD32Async", "occupancy 0"}:
        return shape.cooperative > 0
    if call == "cuMemsetD8Async":
        return shape.zero_ranges > 0
    if call == "cuLaunchKernel" and where == "run":
        return shape.plain > 0
    if where == "blame" or nth == BLAME_LOOKUP:
        return any(elements > 0 for _, elements, _ in shape.checks)
    return True


def _fire(bound: Bound | None, make: Callable[[], Bound], where: str) -> str | None:
    """The library call the fault hits; its LaunchError's text, or None when it raised nothing."""
    try:
        if bound is None:
            make().program.close()
        elif where == "blame":
            outputs = bound.pointers[1]
            bound.program.blame(outputs, outputs, STREAM)
        else:
            bound.run()
    except LaunchError as err:
        return str(err)
    return None


def _still_failing(bound: Bound | None) -> bool:
    """A sticky fault fails every later call until the context is rebuilt (reset here)."""
    try:
        if bound is not None:
            bound.run()
    except LaunchError:
        return True
    return False


def faults(
    driver: fake_driver.FakeDriver, library: LaunchLibrary, options: CudaCpuOptions, case: Case
) -> list[dict[str, Any]]:
    """Each fault once: the library call raises LaunchError naming the driver call (the op falls back to TF's
    ops), contexts stay balanced, a failed create leaves nothing loaded or pinned, and after a reset the same
    cluster runs and matches again (the op's next step) and is destroyed without a leak."""
    outcomes = []
    _, plan = planned(case)
    shape = spec_shape(plan.spec)
    inputs = random_inputs(case.graph, case.seed)
    want, wide = evaluate(case.graph, inputs), evaluate(case.graph, inputs, "float64")
    for call, result, sticky, where, nth in FAULTS:
        if not _applies(call, where, nth, shape):
            continue
        driver.forget_device_memory()
        memory = Memory(driver)
        books = driver.books
        driver.reset()
        problems: list[str] = []
        outcome: dict[str, Any] = {"cluster": case.label, "call": call, "result": result, "sticky": sticky}
        outcome.update(where=where, problems=problems)
        bound = bind(library, options, case, memory, inputs) if where != "create" else None
        if bound is not None and where == "blame":
            bound.run()
        if call == "occupancy 0":
            driver.occupancy(0)
        else:
            driver.inject(call, result, len(plan.kernels) + 1 if nth == BLAME_LOOKUP else nth, sticky=sticky)
        error = _fire(bound, functools.partial(bind, library, options, case, memory, inputs), where)
        if error is None:
            problems.append("no LaunchError")
        outcome["error"] = error or ""
        if call != "occupancy 0" and not any(line.startswith(f"! {call} injected") for line in driver.log()):
            problems.append("the injected failure never fired")
        pushes, pops, depth = driver.balance
        if pushes != pops or depth != 0:
            problems.append(f"unbalanced contexts after the fault: {pushes} pushes, {pops} pops")
        if bound is None and (driver.books.modules, driver.books.pinned) != (books.modules, books.pinned):
            problems.append(f"a failed create leaked: {driver.books}, before {books}")
        if sticky and not _still_failing(bound):
            problems.append("a sticky fault did not fail the next run")
        driver.reset()
        again = bound or bind(library, options, case, memory, inputs)
        again.run()
        output_checks = design_rule(case.graph, inputs, again.results(), want, wide)
        problems += [f"after recovery {n}: {v.reason}" for n, v in output_checks.items() if not v.ok]
        again.program.close()
        if (driver.books.modules, driver.books.pinned) != (books.modules, books.pinned):
            problems.append(f"leaked after recovery: {driver.books}, before {books}")
        outcomes.append(outcome)
    return outcomes


def _refusal(driver: fake_driver.FakeDriver) -> str:
    lines = "\n".join(line for line in driver.log() if line.startswith("!"))
    driver.reset()
    return lines


def fake_refusals(
    driver: fake_driver.FakeDriver, library: LaunchLibrary, options: CudaCpuOptions, case: Case
) -> dict[str, str]:
    """What the fake refuses that a GPU would get wrong silently or punish later, each driven through the real
    calls: a cooperative launch whose counter is garbage (the reset the library does, left out), a launch wider
    than the kernel's __launch_bounds__, a copy wider than the module global it targets, a free of pinned memory
    never allocated and a second free, a launch of a function and a second unload after its module's unload,
    a pop without a push. Values: the driver's refusal lines (or the LaunchError), "" if it let it by."""
    lowered, plan = planned(case)
    kernel = plan.kernels[0]
    driver.forget_device_memory()
    memory = Memory(driver)
    found: dict[str, str] = {}
    with library.primary(0):
        module = library.load(driver_image(plan.source, plan.kernels, options))
        function = library.function(module, kernel)
        layout = buffer_layout(lowered.kernels)
        values = [
            memory.garbage(layout[b.name].size * layout[b.name].dtype.itemsize).ctypes.data for b in kernel.params
        ]
        counter = memory.garbage(4).ctypes.data  # 0xFFFFFFFF, as fresh GPU memory may hold
        arguments = [ctypes.c_uint64(v) for v in (*values, counter)]
        params = (ctypes.c_void_p * len(arguments))(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in arguments))
        launch = kernel.launch
        driver.reset()
        driver.lib.cuLaunchCooperativeKernel(
            ctypes.c_void_p(function.handle), launch.grid, 1, 1, launch.block, 1, 1, 0, None, params
        )
        found["counter not reset"] = _refusal(driver)
        wide = dataclasses.replace(kernel, launch=dataclasses.replace(launch, block=launch.block * 2))
        try:
            library.launch(function, wide, [*values, counter], STREAM)
        except LaunchError as err:
            found["wider than __launch_bounds__"] = str(err)
        driver.reset()
        refused, address, size = _memory_refusals(driver, memory, module)
        found.update(refused)
        library.unload(module)
        driver.reset()
        word = ctypes.c_uint64()
        driver.lib.cuMemcpyHtoD_v2(address, ctypes.byref(word), size)
        found["copy into an unloaded module's global"] = _refusal(driver)
        try:
            library.launch(function, kernel, [*values, counter] if kernel.grid_barrier else values, STREAM)
        except LaunchError as err:
            found["launch after unload"] = f"{err}\n{_refusal(driver)}"
        try:
            library.unload(module)
        except LaunchError as err:
            found["second unload"] = str(err)
    driver.reset()
    driver.lib.cuCtxPopCurrent_v2(None)
    found["pop without a push"] = _refusal(driver)
    return found


@dataclass(frozen=True)
class HandCase(Case):
    """A hand-written kernel program standing for a cluster: `graph` gives the op's inputs and outputs by
    name (its own ops are not what the kernels compute), `program` the kernels and their buffers."""

    program: Lowered | None = None

    def lowered(self) -> Lowered:
        assert self.program is not None
        return self.program


def large_smem_case() -> HandCase:
    """`suite_kernels.large_smem_kernel` (64 KiB of dynamic shared memory per block, past the 48 KiB a launch
    gets without opting in) as a one-kernel program from input `x` to output `y`."""
    kernel = large_smem_kernel()
    builder = GraphBuilder()
    x = builder.parameter("x", (2 * LARGE_TILE,))
    builder.output("y", builder.neg(x))
    graph = builder.build()
    return HandCase(
        "large shared memory", graph, PlanOptions(), program=Lowered((kernel,), (("x", "x"),), (("y", "y"),))
    )


def large_shared_memory(
    driver: fake_driver.FakeDriver, library: LaunchLibrary, options: CudaCpuOptions
) -> dict[str, Any]:
    """The > 48 KiB dynamic shared-memory kernel through the launch library: the program opts the function in
    (cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) at create) and runs it twice on garbage-filled output;
    a launch of the same kernel from a function that was not opted in is refused by the fake, as a GPU
    refuses it; a failure of the opt-in call is a LaunchError naming it, leaking nothing."""
    case = large_smem_case()
    driver.forget_device_memory()
    memory = Memory(driver)
    books = driver.books
    x = np.arange(2 * LARGE_TILE, dtype=np.float32)
    driver.reset()
    bound = bind(library, options, case, memory, {"x": x})
    found: dict[str, Any] = {"dynamic_smem": bound.plan.kernels[0].dynamic_smem_bytes}
    found["opt_in"] = [line for line in driver.log() if line.startswith("cuFuncSetAttribute")]
    want = x.reshape(2, LARGE_TILE)[:, ::-1].reshape(-1)
    runs = []
    for _ in range(RUNS):
        driver.reset()
        bound.run()
        runs.append(bool(np.array_equal(bound.results()["y"], want)) and not _refused(driver.log()))
    found["runs_equal"] = runs
    kernel = bound.plan.kernels[0]
    with library.primary(0):
        module = library.load(driver_image(bound.plan.source, bound.plan.kernels, options))
        plain = library.function(module, dataclasses.replace(kernel, dynamic_smem_bytes=0))  # no opt-in
        driver.reset()
        try:
            library.launch(plain, kernel, [a.ctypes.data for a in (*bound.inputs, *bound.outputs)], STREAM)
            found["without_opt_in"] = ""
        except LaunchError as err:
            found["without_opt_in"] = f"{err}\n{_refusal(driver)}"
        library.unload(module)
    bound.program.close()
    driver.reset()
    driver.inject("cuFuncSetAttribute", fake_driver.INVALID_VALUE)
    try:
        bind(library, options, case, memory, {"x": x})
        found["opt_in_fault"] = ""
    except LaunchError as err:
        found["opt_in_fault"] = str(err)
    found["leaked"] = (driver.books.modules, driver.books.pinned) != (books.modules, books.pinned)
    return found


def _declare_memory_calls(lib: Any) -> None:
    lib.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t)]
    lib.cuModuleGetGlobal_v2.argtypes += [ctypes.c_void_p, ctypes.c_char_p]
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]


def _memory_refusals(driver: fake_driver.FakeDriver, memory: Memory, module: int) -> tuple[dict[str, str], int, int]:
    """A copy wider than the module global it targets, a free of pinned memory never allocated, a second
    free; each refused (a GPU would corrupt memory, or the driver say INVALID_VALUE). Also the global's
    address and size, for a copy after the module's unload."""
    found: dict[str, str] = {}
    lib = driver.lib
    _declare_memory_calls(lib)
    address, size = ctypes.c_uint64(), ctypes.c_size_t()
    lib.cuModuleGetGlobal_v2(ctypes.byref(address), ctypes.byref(size), module, b"sf_nonfinite_flag")
    found["sf_nonfinite_flag bytes"] = str(size.value)
    source = (ctypes.c_uint8 * (size.value + 8))()
    lib.cuMemcpyHtoD_v2(address, source, size.value + 8)
    found["copy wider than its global"] = _refusal(driver)
    pinned = ctypes.c_void_p()
    lib.cuMemHostAlloc(ctypes.byref(pinned), 8, 0)
    lib.cuMemFreeHost(memory.garbage(8).ctypes.data)
    found["free of memory never allocated"] = _refusal(driver)
    lib.cuMemFreeHost(pinned)
    lib.cuMemFreeHost(pinned)
    found["second free"] = _refusal(driver)
    return found, int(address.value), int(size.value)


def missing_calls(driver: fake_driver.FakeDriver) -> list[str]:
    """The driver calls csrc/launch.c resolves that the fake does not export."""
    return sorted({name for name in _RESOLVED.findall(LAUNCH_SOURCE) if not hasattr(driver.lib, name)})


def main(argv: list[str]) -> int:
    cache, out, labels = Path(argv[0]), Path(argv[1]), argv[2:]
    driver = fake_driver.FakeDriver(fake_driver.build(cache))
    driver.device(sms=132, arch=(9, 0))
    library = LaunchLibrary(build_launcher(ArtifactCache(cache / "launch", suffix="so")))
    library.init()
    options = CudaCpuOptions(cache, debug=True)
    # by default every graph's barrier cluster and one graph's plain cluster: the host half is the same code for
    # every cluster of a kind, and each driven cluster costs its cuda-cpu build (the sweep drives them all)
    if labels:
        cases = [c for c in workload_cases() if c.label in labels or "all" in labels]
    else:
        cases = workload_slice(plain_graphs=1)
    if "repeats" in labels:  # outputs repeating an earlier one's value: the op hands them its buffer
        cases.append(Case("repeats", repeating(), PlanOptions(device="tiny")))
    report: dict[str, Any] = {
        "missing_calls": missing_calls(driver),
        "resolved": sorted(set(_RESOLVED.findall(LAUNCH_SOURCE))),
    }
    report["clusters"] = [asdict(drive(driver, library, options, case)) for case in cases]
    kinds = {planned(c)[1].spec[4] >= 0: c for c in reversed(cases)}  # the first of each
    report["faults"] = [f for c in kinds.values() for f in faults(driver, library, options, c)]
    if True in kinds:
        report["refusals"] = fake_refusals(driver, library, options, kinds[True])
    report["large_shared_memory"] = large_shared_memory(driver, library, options)
    report["books"] = asdict(driver.books)
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
