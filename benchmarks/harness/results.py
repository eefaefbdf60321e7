"""A run's record as files: JSON (everything) and a Markdown table, named by device and date.

Input: the record `bench.run` returns and an output folder. Output: two paths,
`<device>_<YYYY-MM-DD>.json` and `.md` (device name lower-cased, non-alphanumerics as
`-`; a dry run's device name says it is a CPU). CPU and GPU figures never share a file.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

BASELINES = ("per_op", "jax_jit", "torch_compile")


def stem(device: str, when: dt.date) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "device"
    return f"{slug}_{when.isoformat()}"


def _us(figure: dict[str, Any] | None) -> str:
    return f"{figure['median_s'] * 1e6:.1f}" if figure else "-"


def _row(record: dict[str, Any]) -> str:
    shape = "x".join(str(d) for d in record.get("shape", ())) or "-"
    head = f"| {record['case']} | {shape} | {record.get('dtype', '-')} | {record.get('io_bytes', 0) / 1e6:.2f} |"
    if "variants" not in record:
        why = record.get("error") or record.get("skipped", "not timed")
        reason = record.get("checks", {}).get("stitch", {}).get("reason", "")
        return head + f" not timed: {why} {reason} |" + " |" * 9
    v = record["variants"]
    s = v["stitch"]
    cells = [_us(s), f"{s['gbps']:.0f}", f"{s['pct_copy']:.0f}%"]
    cells += [_us(v.get(b)) for b in BASELINES]
    cells += [f"{s[f'speedup_vs_{b}']:.2f}x" if f"speedup_vs_{b}" in s else "-" for b in BASELINES]
    cells.append(f"{s.get('kernels')} / {v.get('per_op', {}).get('kernels', '-')}")
    return head + " " + " | ".join(cells) + " |"


def markdown(run: dict[str, Any]) -> str:
    copy = run["copy"]
    lines = [
        f"# stitchfleet benchmark: {run['device']}",
        "",
        f"Clock: {run['clock']}. Copy bandwidth (`dst.copy_(src)`, read + write): {copy['gbps']:.0f} GB/s.",
        f"Median of {run['options']['runs']} interleaved samples after {run['options']['warmup']} warm-up calls.",
        "Effective GB/s = IO bytes (unique inputs + outputs) / time. Speedups: baseline time / stitch time.",
        "",
        "| case | shape | dtype | IO MB | stitch us | GB/s | % copy | per_op us | jax_jit us | torch_compile us "
        "| x per_op | x jax_jit | x torch_compile | kernels stitch / per_op |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [_row(r) for r in run["cases"]]
    summary = run.get("geomean_speedup", {})
    if summary:
        lines += [
            "",
            "Geometric mean speedup of stitch: "
            + ", ".join(f"{k.removeprefix('speedup_vs_')} {v:.2f}x" for k, v in summary.items()),
        ]
    failed = [(r["case"], n, c["reason"]) for r in run["cases"] for n, c in r.get("checks", {}).items() if not c["ok"]]
    if failed:
        lines += ["", "Failed correctness checks (not timed):", ""] + [f"- {c} {n}: {why}" for c, n, why in failed]
    missing = sorted({(n, why) for r in run["cases"] for n, why in r.get("not_run", {}).items()})
    if missing:
        lines += ["", "Variants not run:", ""] + [f"- {n}: {why}" for n, why in missing]
    return "\n".join(lines) + "\n"


def write(run: dict[str, Any], out_dir: Path, when: dt.date | None = None) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / stem(run["device"], when or dt.date.today())
    json_path, md_path = base.with_suffix(".json"), base.with_suffix(".md")
    json_path.write_text(json.dumps(run, indent=1, default=str))
    md_path.write_text(markdown(run))
    return json_path, md_path


def _summary_row(record: dict[str, Any]) -> str:
    if "variants" not in record:
        return f"{record['case']:<40} not timed: {record.get('error') or record.get('skipped', 'no figures')}"
    s = record["variants"]["stitch"]
    speedups = [f"{s[f'speedup_vs_{b}']:.2f}x" if f"speedup_vs_{b}" in s else "-" for b in BASELINES]
    cells = f"{s['median_s'] * 1e6:>10.1f} {s['gbps']:>8.3g} " + " ".join(f"{x:>13}" for x in speedups)
    return f"{record['case']:<40} {cells}"


def summary_lines(run: dict[str, Any]) -> list[str]:
    """A short fixed-width table for the terminal: stitch's time, GB/s and speedups per case."""
    head = f"{'case':<40} {'stitch us':>10} {'GB/s':>8} " + " ".join(f"{'x ' + b:>13}" for b in BASELINES)
    lines = [head] + [_summary_row(r) for r in run["cases"]]
    summary = run.get("geomean_speedup", {})
    if summary:
        lines.append("geomean: " + ", ".join(f"x {k.removeprefix('speedup_vs_')} {v:.2f}" for k, v in summary.items()))
    return lines
