"""How many of a live training graph's clusters the hook can install, and why the others stay with TF.

Input: command-line options (`PYTHONPATH=. python scripts/cluster_mapping.py [--model NAME ...]
[--no-translation] [--reasons N]`); TensorFlow (CPU). Output: a markdown table on stdout, per
model: the compiler's clusters, those the planner refused, those mapped onto the TF graph
(`sites.map_cluster`, what the hook does in `begin`), those left off the training path, those the
translation check refuses, and what remains installable; then the most frequent refusal reasons
(names and figures blanked so that equal causes count together).

The graphs are what a user's session holds, built live in TF1 graph mode (not a GraphDef, which
would lose the Python-side collections): Keras applications at their smallest inputs with
`weights=None`, batch 2, Keras' learning phase 1, Adam, the moving-average updates as control
dependencies of the train op (as `model.updates` is used); a transformer from Keras layers; and the
workload models of `demo/models.py` at size `small`. No cluster is compiled (hundreds of
C compiles would take this machine minutes per model): "installable" means the hook would go on
to compile it. Run it on a checkout of another commit (PYTHONPATH first) to compare.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: a checkout named there is the one measured

from benchmarks.keras_apps import BATCH, KERAS_MODELS  # noqa: E402
from stitchfleet import settings  # noqa: E402
from stitchfleet.compiler.decision import Decision  # noqa: E402
from stitchfleet.compiler.pipeline import Options, compile_graph  # noqa: E402
from stitchfleet.demo import models  # noqa: E402
from stitchfleet.plugin.frontend import library_fusions  # noqa: E402
from stitchfleet.plugin.frontend.converter import convert  # noqa: E402
from stitchfleet.plugin.graph.mapping import StepOps, UnmappableError, map_cluster  # noqa: E402
from stitchfleet.plugin.graph.training_steps import data_path, training_path  # noqa: E402
from stitchfleet.plugin.guard.translation import check_sites  # noqa: E402
from stitchfleet.plugin.setup.job_graph import fusions  # noqa: E402

v1 = tf.compat.v1
WORKLOADS = ("crnn_head", "bert_encoder", "transformer_block", "dien_attention_gru")
MODELS = (*KERAS_MODELS, *WORKLOADS)


@dataclass
class Figures:
    clusters: int = 0
    planner_refused: int = 0
    mapped: int = 0
    off_path: int = 0
    translation_refused: int = 0
    in_clusters: int = 0  # TF ops (their output tensors) inside the compiler's clusters
    held: int = 0  # TF ops kept with their compute op for the TF library's fused epilogue
    reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def installable(self) -> int:
        return self.mapped - self.off_path - self.translation_refused


def _keras_graph(name: str) -> Any:
    """The live graph of one Adam training step of Keras model `name` (see the module docstring)."""
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(0)
        tf.keras.backend.set_learning_phase(1)
        out = KERAS_MODELS[name]()
        labels = v1.placeholder(tf.int32, [BATCH], name="labels")
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, out), name="loss")
        updates = [op for op in graph.get_operations() if op.type == "AssignSubVariableOp"]
        with tf.control_dependencies(updates):
            v1.train.AdamOptimizer(1e-3).minimize(loss, name="train")
    return graph


def _graph(name: str) -> Any:
    return models.build(name, "small") if name in WORKLOADS else _keras_graph(name)


def general(reason: str) -> str:
    """A refusal reason with TF names, tensor names and figures blanked."""
    text = re.sub(r"'[^']*'", "'…'", reason)
    text = re.sub(r"\b[\w./-]+:\d+\b", "…", text)
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)


def measure(name: str, translation: bool, keep_fusions: bool = True) -> Figures:
    started = time.perf_counter()
    graph = _graph(name)
    figures = Figures()
    with graph.as_default():
        conversion = convert(StepOps(graph), name=name)
        live = data_path(graph)
        held = library_fusions.held(conversion, fusions(settings.current().backend), live) if keep_fusions else {}
        # as the hook compiles (job_graph.compiled)
        options = Options(baselines=("per_op",), origins=frozenset(conversion.origins), held=held)
        art = compile_graph(conversion.graph, options)
        scope = art.need_clusters()
        figures.in_clusters = len(
            {conversion.origins[n].op for c in scope.clusters for n in c.nodes if n in conversion.origins}
        )
        figures.held = len({conversion.origins[n].op for n in held if n in conversion.origins})
        figures.reasons.update(f"held: {held[n]}" for n in held if n in conversion.origins)
        path = training_path(graph)
        sites = []
        for index, (cluster, plan) in enumerate(zip(art.cluster_graphs, art.stitch, strict=True)):
            figures.clusters += 1
            if isinstance(plan, Decision):
                figures.planner_refused += 1
                figures.reasons[f"planner: {general(plan.reason)}"] += 1
                continue
            try:
                site = map_cluster(graph, conversion, index, cluster, plan)
            except UnmappableError as err:
                figures.reasons[f"not mapped: {general(str(err))}"] += 1
                continue
            figures.mapped += 1
            if not any(op.name in path for op in site.internal):
                figures.off_path += 1
                figures.reasons["not on the training path"] += 1
                continue
            sites.append(site)
        if translation:
            refused = check_sites(graph, sites, settings.load({}).tolerance_factor)
            figures.translation_refused = len(refused)
            figures.reasons.update(f"translation: {general(reason)}" for reason in refused.values())
    figures.seconds = time.perf_counter() - started
    return figures


def table(results: dict[str, Figures], translation: bool) -> str:
    checked = "translation refused" if translation else "translation (not run)"
    lines = [
        f"| model | TF ops in clusters | epilogues held | clusters | planner refused | not mapped | mapped | "
        f"off training path | {checked} | installable |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in results.items():
        unmapped = f.clusters - f.planner_refused - f.mapped
        lines.append(
            f"| {name} | {f.in_clusters} | {f.held} | {f.clusters} | {f.planner_refused} | {unmapped} | "
            f"{f.mapped} | {f.off_path} | "
            f"{f.translation_refused if translation else '-'} | {f.installable} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="*", choices=MODELS, default=list(MODELS))
    parser.add_argument("--no-translation", action="store_true", help="skip the translation check (faster)")
    parser.add_argument("--reasons", type=int, default=4, help="reasons listed per model")
    parser.add_argument(
        "--no-library-fusions", action="store_true", help="let clusters take the epilogues TF's library fuses"
    )
    args = parser.parse_args(argv)
    translation = not args.no_translation
    results: dict[str, Figures] = {}
    for name in args.model:
        results[name] = measure(name, translation, not args.no_library_fusions)
        print(f"{name}: {results[name].seconds:.0f} s", file=sys.stderr)
    import stitchfleet

    print(f"stitchfleet from {Path(stitchfleet.__file__).parent}, TensorFlow {tf.__version__} (CPU)\n")
    print(table(results, translation))
    print()
    for name, f in results.items():
        top = "; ".join(f"{count} x {reason}" for reason, count in f.reasons.most_common(args.reasons))
        print(f"- {name}: {top or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
