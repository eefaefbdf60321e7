"""The generated C of a cluster, remembered on disk: a warm pod does not generate it again.

Input: a cluster `Graph`, its `StitchPlan`, the C function's name and the cache directory.
Output: the `CSource` `cluster_source` returns for them (function, text, parameters), read from
`<cache>/cpu-source/<key>.json` when an earlier process of the same code wrote it, else
generated and written there. The shared object is still looked up by the text (`library_key`):
this cache only skips the generation, ~15 ms a cluster on a 2-core machine (0.19 s of the demo
model's 0.6 s warm `begin`).

The key is a sha256 over everything the text can depend on: the whole graph as serialized
(names and metadata included), the plan, the function name, and the digest of the compiler
package's own source files, so a changed generator (any file of stitchfleet/compiler) never
reads an entry an older one wrote. An unreadable or malformed entry is a miss.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from pathlib import Path

from stitchfleet.compiler.ir import Graph
from stitchfleet.compiler.ir.serialization import to_json
from stitchfleet.compiler.ir.types import DType
from stitchfleet.compiler.plan import StitchPlan
from stitchfleet.compiler.targets.cache import artifact_cache
from stitchfleet.compiler.targets.cpu.generator import CSource, Param
from stitchfleet.compiler.targets.cpu.source import cluster_source

COMPILER_DIR = Path(__file__).resolve().parents[2]  # stitchfleet/compiler


@functools.cache
def code_digest() -> str:
    """sha256 over the compiler package's .py files (relative path and bytes), read once per process."""
    digest = hashlib.sha256()
    for path in sorted(COMPILER_DIR.rglob("*.py")):
        digest.update(str(path.relative_to(COMPILER_DIR)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def source_key(graph: Graph, plan: StitchPlan, function: str) -> str:
    """The cache key of `cluster_source(graph, plan, function)` under this compiler's code."""
    # repr: the plan is frozen dataclasses of tuples, enums and numbers (no sets), a deterministic text 8x
    # cheaper than its to_json (asdict copies it: 40 ms of the demo model's 55 ms of keys)
    doc = {"graph": to_json(graph), "plan": repr(plan), "function": function, "code": code_digest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _encode(source: CSource) -> bytes:
    params = [[p.cname, p.name, p.dtype.value, list(p.shape), p.output] for p in source.params]
    return json.dumps({"function": source.function, "text": source.text, "params": params}).encode()


def _decode(data: bytes) -> CSource | None:
    try:
        doc = json.loads(data)
        params = tuple(
            Param(str(c), str(n), DType(d), tuple(int(x) for x in s), bool(o)) for c, n, d, s, o in doc["params"]
        )
        return CSource(str(doc["function"]), str(doc["text"]), params)
    except (ValueError, KeyError, TypeError):
        return None


def cached_source(graph: Graph, plan: StitchPlan, function: str, cache_dir: Path) -> CSource:
    """`cluster_source(graph, plan, function)`, from the cache when an earlier process generated it."""
    cache = artifact_cache(Path(cache_dir), "cpu-source")
    key = source_key(graph, plan, function)
    cached = cache.get(key)
    found = _decode(cached) if cached is not None else None
    if found is not None:
        return found
    source = cluster_source(graph, plan, function)
    with contextlib.suppress(OSError):  # a read-only cache still compiles; only the next process regenerates
        cache.put(key, _encode(source))
    return source
