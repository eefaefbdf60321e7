"""The evidence of a numeric revert, kept so that it can be judged again offline.

Input: the cluster's IR, the values its inputs had on the check step, TF's and the stitched results, the
guard's `Finding` and factor. Output: The rules in full: docs/plugin/guard.md.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stitchfleet.compiler.evaluate import Array
from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.ir.serialization import dumps, loads
from stitchfleet.plugin.guard.numeric import Finding, judge

MARK = "evidence: "  # the line of a revert's detail that holds the JSON
INLINE_MAX = 256 * 1024  # a larger blob stays in the pod's evidence directory only (its path is in the JSON)
SAMPLE = 4


@dataclass(frozen=True)
class Evidence:
    graph: Graph
    inputs: list[Array]
    original: list[Array]
    stitched: list[Array]
    factor: float

    @property
    def digest(self) -> str:
        """sha256 of the inputs (dtype, shape, bytes): which step's values were judged."""
        h = hashlib.sha256()
        for value in self.inputs:
            h.update(f"{value.dtype.str}{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
        return h.hexdigest()

    def blob(self) -> bytes:
        arrays = {f"{side}_{k}": v for side in ("in", "tf", "st") for k, v in enumerate(self._side(side))}
        buffer = io.BytesIO()
        meta = json.dumps({"graph": dumps(self.graph), "factor": self.factor})
        np.savez_compressed(buffer, meta=np.frombuffer(meta.encode(), np.uint8), **arrays)
        return buffer.getvalue()

    def _side(self, side: str) -> list[Array]:
        return {"in": self.inputs, "tf": self.original, "st": self.stitched}[side]

    def summary(self, finding: Finding, stored: Path | None) -> dict[str, object]:
        """The JSON of a revert's detail (see the module docstring)."""
        outputs = [name for name, _ in self.graph.outputs]
        worst = outputs.index(finding.output) if finding.output in outputs else 0
        blob = self.blob()
        doc: dict[str, object] = {
            "digest": self.digest,
            "inputs": [_sample(v) for v in self.inputs],
            "output": outputs[worst],
            "tf": _sample(self.original[worst]),
            "stitched": _sample(self.stitched[worst]),
            "rule": {"factor": self.factor, "error": finding.compiled_error, "allowed": finding.allowed},
            "reason": finding.reason,
            "path": str(stored) if stored is not None else None,
        }
        if len(blob) <= INLINE_MAX:
            doc["blob"] = base64.b64encode(blob).decode()
        return doc


def _sample(value: Array) -> dict[str, Any]:
    flat = np.asarray(value).ravel()
    return {"shape": list(np.shape(value)), "dtype": str(flat.dtype), "first": flat[:SAMPLE].tolist()}


def captured(
    graph: Graph,
    inputs: Sequence[npt.ArrayLike],
    original: Sequence[npt.ArrayLike],
    stitched: Sequence[npt.ArrayLike],
    factor: float,
) -> Evidence:
    as_arrays = [np.array(v, copy=True) for v in inputs], [np.array(v) for v in original]
    return Evidence(graph, *as_arrays, [np.array(v) for v in stitched], factor)


def kept(evidence: Evidence, finding: Finding, directory: Path | None) -> str:
    """The detail line of a revert (`MARK` + JSON); the blob is written to `directory/<digest>.npz` when given
    (a write error only leaves it out: the revert is recorded regardless)."""
    stored = None
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            stored = directory / f"{evidence.digest}.npz"
            stored.write_bytes(evidence.blob())
        except OSError:
            stored = None
    return MARK + json.dumps(evidence.summary(finding, stored), separators=(",", ":"))


def parsed(detail: str) -> dict[str, object] | None:
    """The evidence JSON of a revert's detail, or None when it holds none."""
    for line in detail.splitlines():
        if line.startswith(MARK):
            found = json.loads(line[len(MARK) :])
            return found if isinstance(found, dict) else None
    return None


def loaded(doc: Mapping[str, object], path: Path | None = None) -> Evidence:
    """The evidence from its inline blob, else from `path` or the path it names; ValueError when neither is
    there or its inputs do not match the digest."""
    if "blob" in doc:
        raw = base64.b64decode(str(doc["blob"]))
    else:
        source = path or (Path(str(doc["path"])) if doc.get("path") else None)
        if source is None or not source.is_file():
            raise ValueError(f"the evidence blob is not inline and {source or 'no file'} cannot be read")
        raw = source.read_bytes()
    with np.load(io.BytesIO(raw)) as stored:
        meta = json.loads(bytes(stored["meta"]).decode())
        sides = {s: [stored[f"{s}_{k}"] for k in range(_count(stored.files, s))] for s in ("in", "tf", "st")}
    found = Evidence(loads(meta["graph"]), sides["in"], sides["tf"], sides["st"], float(meta["factor"]))
    if doc.get("digest") and found.digest != doc["digest"]:
        raise ValueError("the evidence's inputs do not match the revert's digest")
    return found


def _count(files: Sequence[str], side: str) -> int:
    return sum(1 for name in files if name.startswith(f"{side}_"))


def recheck(evidence: Evidence) -> Finding:
    """The guard's rule again on the kept values: the float64 reference evaluated from the inputs, the
    stitched result judged against it with TF's result as the native one."""
    return judge(evidence.graph, evidence.inputs, evidence.original, evidence.stitched, evidence.factor)
