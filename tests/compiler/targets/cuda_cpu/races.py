"""The shared-memory race check over workload clusters: not a test module (the tests import it), and
`python -m tests.compiler.targets.cuda_cpu.races [all | <model>/cluster_<nn> ...]` prints the findings per
workload.

Each cluster is compiled as a race build (`CudaCpuBackend(debug=True, race=True)`: every access to a
block's shared memory checked against shadow state per word between barriers, random yields between
accesses) and run once; a hazard aborts the launch with its description, which is the finding. Runs
that end must still match `evaluate` (the yields reorder threads, never the result of a correct kernel).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stitchfleet.compiler.targets.cuda_cpu.backend import CudaCpuBackend, CudaCpuError
from tests.compiler.targets.cuda_cpu.sweep import Case, buffers_of, judge, workload_cases, workload_slice


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
