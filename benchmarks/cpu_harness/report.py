"""The CPU benchmark's record as files and as a terminal summary.

Input: the run's record (`command.run` builds it: date, CPU, cores, TF version, options,
one row per cluster). Output: per-group totals (`summarise`), `cpu-<date>.json` and
`.md` under a folder (`write`), and short fixed-width lines for the terminal. Only timed
rows (their check passed) enter the totals; the others are listed with their reason.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

HEADER = f"{'cluster':<56} {'ops':>4} {'stitched ms':>12} {'TF ms':>9} {'speedup':>8}"


def timed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "speedup" in r]


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Totals and geometric-mean speedup per group (the workload, or `suite`), timed rows only."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in timed(rows):
        groups.setdefault(r["case"].split("/")[0], []).append(r)
    return {
        g: {
            "clusters": len(rs),
            "cpu_ms_total": sum(r["cpu_ms"] for r in rs),
            "tf_ms_total": sum(r["tf_ms"] for r in rs),
            "speedup_total": sum(r["tf_ms"] for r in rs) / sum(r["cpu_ms"] for r in rs),
            "speedup_geomean": math.exp(statistics.mean(math.log(r["speedup"]) for r in rs)),
        }
        for g, rs in groups.items()
    }


def row_line(row: dict[str, Any]) -> str:
    """One progress line: the figures, or why the cluster was not timed."""
    if "speedup" not in row:
        return f"{row['case']:<56} {row['ops']:>4} not timed: {row['skipped']}"
    return f"{row['case']:<56} {row['ops']:>4} {row['cpu_ms']:>12.3f} {row['tf_ms']:>9.3f} {row['speedup']:>7.2f}x"


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = [f"{'group':<24} {'clusters':>8} {'stitched ms':>12} {'TF ms':>10} {'x sum':>7} {'x geomean':>9}"]
    for g, s in doc["summary"].items():
        lines.append(
            f"{g:<24} {s['clusters']:>8} {s['cpu_ms_total']:>12.2f} {s['tf_ms_total']:>10.2f} "
            f"{s['speedup_total']:>6.2f}x {s['speedup_geomean']:>8.2f}x"
        )
    return lines


def _intro(doc: dict[str, Any]) -> list[str]:
    scale = doc["options"]["scale"]
    sizing = "" if scale == 1 else f" Suite shapes scaled to {scale:g} of their rows."
    return [
        f"# CPU figures ({doc['date']})",
        "",
        f"CPU: {doc['cpu']}, **{doc['cores']} cores** (OpenMP uses all of them; TF's intra-op pool too).",
        "Stitched `cpu` backend (C + OpenMP, gcc -O3 -march=native, no fast-math) vs plain TensorFlow "
        f"{doc['tf_version']} CPU running the same cluster op by op (tf.function, no XLA). Medians of "
        f"{doc['reps']} interleaved runs after warm-up, same process, same inputs; stitched outputs checked "
        f"against `evaluate` (guard rule, factor 8) before timing. These are CPU figures, not GPU ones.{sizing}",
        "",
    ]


def markdown(doc: dict[str, Any]) -> str:
    lines = _intro(doc)
    lines += ["| group | clusters | stitched ms (sum) | TF ms (sum) | speedup (sum) | speedup (geomean) |"]
    lines += ["|---|---:|---:|---:|---:|---:|"]
    for g, s in doc["summary"].items():
        lines.append(
            f"| {g} | {s['clusters']} | {s['cpu_ms_total']:.2f} | {s['tf_ms_total']:.2f} | "
            f"{s['speedup_total']:.2f}x | {s['speedup_geomean']:.2f}x |"
        )
    lines += ["", "| cluster | MI ops | elements | stitched ms | TF ms | speedup |", "|---|---:|---:|---:|---:|---:|"]
    for r in timed(doc["rows"]):
        lines.append(
            f"| {r['case']} | {r['ops']} | {r['elements']} | {r['cpu_ms']:.3f} | {r['tf_ms']:.3f} "
            f"| {r['speedup']:.2f}x |"
        )
    failed = [r for r in doc["rows"] if "speedup" not in r]
    if failed:
        lines += ["", "Not timed:", ""] + [f"- {r['case']}: {r['skipped']}" for r in failed]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """`cpu-<date>.json` and `.md` under out_dir (made when missing); an earlier run that day is replaced."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"cpu-{doc['date']}.json", out_dir / f"cpu-{doc['date']}.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(markdown(doc))
    return json_path, md_path
