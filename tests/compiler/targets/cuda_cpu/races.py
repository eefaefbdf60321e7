"""The shared-memory race check over workload clusters: not a test module (the tests import it), and
`python -m tests.compiler.targets.cuda_cpu.races [all | <model>/cluster_<nn> ...]` prints the findings per
workload.

Each cluster is compiled as a race build (`CudaCpuBackend(debug=True, race=True)`: every access to a
block's shared memory checked against shadow state per word between barriers, random yields between
accesses) and run once; a hazard aborts the launch with its description, which is the finding. Runs
that end must still match `evaluate` (the yields reorder threads, never the result of a correct kernel).
`RACE_SLICE` is the default tier's clusters: one of each kind of shared-memory use (`shared_use`).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.lower import Lowered
from stitchfleet.compiler.targets.cuda.signature import has_grid_sync
from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend, CudaCpuError
from tests.compiler.targets.cuda_cpu.sweep import Case, buffers_of, judge, workload_cases, workload_slice

# The default tier's race check: per kind of shared-memory use among the workload clusters, its cheapest
# cluster (race-build seconds on a loaded 2-core machine, session 24). The kinds are what the check tells
# apart: which shared arrays the kernel has (regional values kept in shared memory, a block reduction's
# per-warp partials) and whether a grid barrier runs between their uses. The workload slice's other
# clusters are of kinds below at 10-40x the time (bert_encoder/cluster_00 and cluster_05, 47 and 93 s;
# transformer_block/cluster_07, 49 s); `test_every_workload_cluster_has_no_race` (sweep) checks them all.
RACE_SLICE = {
    "crnn_head/cluster_02": "no shared memory, no grid barrier (0.1 s)",
    "crnn_head/cluster_00": "no shared memory, a grid barrier (2.5 s)",
    "transformer_block/cluster_00": "regional values in shared memory, as bert_encoder/cluster_00 (8 s)",
    "dien_attention_gru/cluster_21": "regional values across a grid barrier, as bert_encoder/cluster_05 (0.6 s)",
    "crnn_head/cluster_15": "regional values and warp partials across a grid barrier, as transformer_block/"
    "cluster_07 (10 s)",
    "dien_attention_gru/cluster_43": "warp partials only, one block (build time only)",
}
# the kind the slice leaves to its own test (test_the_race_build_of_bert_encoder_cluster_03_runs_to_its_verdict)
OWN_TEST = "bert_encoder/cluster_03"  # regional values and warp partials, no grid barrier


def shared_use(lowered: Lowered) -> tuple[bool, bool, bool]:
    """(regional values in shared memory, per-warp partials of a block reduction, a grid barrier) over the
    program's kernels. lower/program.py names the shared arrays: `smem_<node>` for a planned regional value,
    `warp_<dtype>` for the partials."""
    shared = [s.name for k in lowered.kernels for s in k.shared]
    unknown = [name for name in shared if not name.startswith(("smem_", "warp_"))]
    if unknown:
        raise ValueError(f"shared arrays of no known kind: {unknown} (teach shared_use their kind)")
    return (
        any(name.startswith("smem_") for name in shared),
        any(name.startswith("warp_") for name in shared),
        any(has_grid_sync(k.body) for k in lowered.kernels),  # what render_kernel's grid_barrier says
    )


@dataclass(frozen=True)
class RaceFinding:
    label: str
    race: str  # the hazard the check reported, "" when none
    mismatches: tuple[str, ...]  # outputs off `evaluate` (a race the shadow missed would show here)
    checked: int  # shared-memory accesses the check saw during the run (0: the kernel uses none)


def check_races(backend: CudaCpuBackend, cases: Sequence[Case]) -> list[RaceFinding]:
    lowered = [case.lowered() for case in cases]
    programs = backend.compile_many([low.kernels for low in lowered])
    findings = []
    for case, low, program in zip(cases, lowered, programs, strict=True):
        library = program.loaded[0][1]
        library.sf_race_checked.restype = ctypes.c_ulong
        before = int(library.sf_race_checked())
        try:
            raw = program(buffers_of(case, low))
        except CudaCpuError as err:
            findings.append(RaceFinding(case.label, str(err), (), int(library.sf_race_checked()) - before))
            continue
        shapes = {name: case.graph.node(node).shape for name, node in case.graph.outputs}
        got = {name: raw[buf].reshape(shapes[name]) for name, buf in low.outputs}
        output_checks = judge(case, got)
        off = tuple(n for n, v in output_checks.items() if not v.ok)
        findings.append(RaceFinding(case.label, "", off, int(library.sf_race_checked()) - before))
    return findings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="the shared-memory race check over workload clusters")
    parser.add_argument("clusters", nargs="*", help="'all', labels such as bert_encoder/cluster_03, or none: the slice")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/stitchfleet-races"), help="built units")
    args = parser.parse_args(argv)
    if args.clusters == ["all"]:
        cases = workload_cases()
    elif args.clusters:
        by_label = {case.label: case for case in workload_cases()}
        unknown = [label for label in args.clusters if label not in by_label]
        if unknown:
            parser.error(f"no saved workload cluster {', '.join(unknown)} (labels are <model>/cluster_<nn>)")
        cases = [by_label[label] for label in args.clusters]
    else:
        cases = workload_slice()
    began = time.monotonic()
    findings = check_races(CudaCpuBackend(args.cache, debug=True, race=True), cases)
    by_model: dict[str, list[RaceFinding]] = {}
    for finding in findings:
        by_model.setdefault(finding.label.split("/")[0], []).append(finding)
    for model, found in sorted(by_model.items()):
        races = [f for f in found if f.race]
        off = [f for f in found if f.mismatches]
        accesses = sum(f.checked for f in found)
        print(
            f"{model}: {len(found)} cluster(s), {accesses} shared accesses checked, {len(races)} race(s), "
            f"{len(off)} off evaluate"
        )
        for f in races + off:
            print(f"  {f.label}: {f.race or f.mismatches}")
    print(f"{len(findings)} clusters in {time.monotonic() - began:.0f} s")
    return 0 if not any(f.race or f.mismatches for f in findings) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
