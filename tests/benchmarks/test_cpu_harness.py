"""The CPU harness: the IR -> TensorFlow translation, case selection and scaling, the report, the scripts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.cpu_harness import cases, report
from benchmarks.harness.cases import TINY
from benchmarks.suite import CASES, build_case
from stitchfleet.compiler.evaluate import evaluate, random_inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.tf
@pytest.mark.parametrize("name", sorted(CASES))
def test_tf_translation_computes_what_evaluate_does(name: str) -> None:
    import tensorflow as tf

    from benchmarks.cpu_harness.translate_tf import tf_function, tf_inputs

    graph = build_case(name, TINY[name], "f32")
    inputs = random_inputs(graph, 0)
    got = tf_function(tf, graph)(*tf_inputs(tf, graph, inputs))
    expected = evaluate(graph, inputs, "float64")
    assert len(got) == len(expected) == len(graph.outputs)
    for (out_name, _), value in zip(graph.outputs, got, strict=True):
        np.testing.assert_allclose(value.numpy(), expected[out_name], rtol=2e-4, atol=2e-5, err_msg=out_name)


def test_scaled_keeps_the_rows_length_and_refuses_bad_scales() -> None:
    assert cases.scaled((4096, 1024), 0.01) == (41, 1024)
    assert cases.scaled((512, 8192), 1e-6) == (1, 8192)
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match=r"scale must be in \(0, 1\]"):
            cases.scaled((8, 8), bad)


def test_select_filters_by_name_and_elements() -> None:
    chosen = cases.select(["suite/layernorm_fwd", "bert_encoder/cluster_02"], scale=0.01)
    names = [c.name for c in chosen]
    assert names[0] == "bert_encoder/cluster_02" and "suite/layernorm_fwd_41x1024_f32#0" in names
    assert all("layernorm_fwd" in n or n == "bert_encoder/cluster_02" for n in names)
    small = cases.select(["suite/"], scale=0.01, max_elements=400_000)
    assert small and all(c.elements <= 400_000 for c in small)
    assert len(small) < len(cases.select(["suite/"], scale=0.01))
    with pytest.raises(ValueError, match="max_elements must be positive"):
        cases.select([], max_elements=0)


def _document(rows: list[dict[str, object]]) -> dict[str, object]:
    return {
        "date": "2026-11-21",
        "cpu": "test cpu",
        "cores": 2,
        "tf_version": "2.15.1",
        "reps": 3,
        "options": {"only": [], "scale": 1.0, "max_elements": None, "warmup": 1},
        "summary": report.summarise(rows),  # type: ignore[arg-type]
        "rows": rows,
    }


def test_report_totals_timed_rows_and_lists_the_others(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"case": "suite/a#0", "ops": 5, "elements": 10, "cpu_ms": 1.0, "tf_ms": 4.0, "speedup": 4.0},
        {"case": "suite/b#0", "ops": 5, "elements": 10, "cpu_ms": 2.0, "tf_ms": 2.0, "speedup": 1.0},
        {"case": "suite/c#0", "ops": 7, "elements": 10, "skipped": "stitched program failed: y: error 0.1"},
    ]
    doc = _document(rows)
    summary = doc["summary"]["suite"]  # type: ignore[index]
    assert summary["clusters"] == 2 and summary["speedup_total"] == pytest.approx(2.0)
    assert summary["speedup_geomean"] == pytest.approx(2.0)
    json_path, md_path = report.write(doc, tmp_path / "new")
    assert json_path.name == "cpu-2026-11-21.json" and md_path.name == "cpu-2026-11-21.md"
    text = md_path.read_text()
    assert (
        "| suite | 2 | 3.00 | 6.00 | 2.00x | 2.00x |" in text
        and "| suite/a#0 | 5 | 10 | 1.000 | 4.000 | 4.00x |" in text
    )
    assert "- suite/c#0: stitched program failed: y: error 0.1" in text and "| suite/c#0 |" not in text
    assert "not timed: stitched program failed" in report.row_line(rows[2])


@pytest.mark.parametrize(("script", "option"), [("bench_cpu.py", "--max-elements"), ("bench_gpu.py", "--dry-run")])
def test_scripts_are_wrappers_that_run_from_anywhere(script: str, option: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"usage: {script}" in result.stdout and option in result.stdout
