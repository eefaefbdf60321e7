"""Shape signatures: the sizes a job really feeds where its graph says `None`.

Input: the user's `tf.Graph` at `begin`, the kernel cache directory, and per training step the values fed to
its placeholders and the shapes its `tf.data` iterator reads gave (fetched with the step). Output: The rules
in full: docs/plugin/shapes.md.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tensorflow as tf

from stitchfleet.plugin.frontend.context import LiveMarks
from stitchfleet.plugin.frontend.converter import convert
from stitchfleet.plugin.graph.graph_identity import graph_key
from stitchfleet.plugin.graph.mapping import StepOps
from stitchfleet.plugin.graph.training_steps import training_path
from stitchfleet.plugin.graph.twin_mark import PREFIX as TWIN_PREFIX
from stitchfleet.telemetry.kinds import EventKind

if TYPE_CHECKING:
    from stitchfleet.plugin.fleet.ledger import Ledger
    from stitchfleet.plugin.frontend import Conversion
    from stitchfleet.plugin.graph.mapping import Site
    from stitchfleet.plugin.graph.twin import Feeds
    from stitchfleet.plugin.native.kernels import ClusterKernel

log = logging.getLogger("stitchfleet.plugin")
FEEDABLE = frozenset({"Placeholder", "PlaceholderV2"})
ITERATORS = frozenset({"IteratorGetNext", "IteratorGetNextSync"})  # a tf.data iterator's reads
BOOK_DIR = "signatures"
GUESS = 32  # a batch size for clusters built before the first feed; rebound to the real one after it
GUESS_TRIES = 64  # guesses tried when TF's shape inference rejects GUESS everywhere (`_guess`)
MAX_SIGNATURES = 8  # per graph: the book is a hint for the next process, not an archive
SHAPE_EVENT = EventKind.SHAPE_SIGNATURE.value


@dataclass(frozen=True)
class Signature:
    """Concrete shapes of a job's partially shaped sources (a placeholder's op name or an iterator output's
    tensor name -> shape), in name order."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, shapes: Mapping[str, tuple[int, ...]]) -> Signature:
        return cls(tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items())))

    @property
    def key(self) -> str:
        """E.g. "x=32x64,y=32": what logs and reasons show."""
        return ",".join(f"{name}={'x'.join(map(str, shape)) or 'scalar'}" for name, shape in self.shapes)

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return dict(self.shapes)


def unknown_sources(graph: tf.Graph, reached: frozenset[str] | None = None) -> list[tf.Operation]:
    """The placeholders and iterator reads with an output of known rank and an unknown dimension, that a
    training step reads when `reached` (op names the step runs) is given."""
    return [
        op
        for op in graph.get_operations()
        if op.type in FEEDABLE | ITERATORS
        and (reached is None or op.name in reached)
        and any(_partial(t) for t in op.outputs[: 1 if op.type in FEEDABLE else None])
    ]


def _partial(tensor: Any) -> bool:
    return bool(tensor.shape.rank is not None and not tensor.shape.is_fully_defined())


def partial_shapes(sources: Sequence[tf.Operation]) -> dict[str, tuple[int | None, ...]]:
    """Each source's key (a placeholder's op name, an iterator output's tensor name) -> its partial shape."""
    found: dict[str, tuple[int | None, ...]] = {}
    for op in sources:
        if op.type in FEEDABLE:
            found[op.name] = tuple(op.outputs[0].shape.as_list())
        else:
            found.update({t.name: tuple(t.shape.as_list()) for t in op.outputs if _partial(t)})
    return found


def read_tensors(sources: Sequence[tf.Operation]) -> list[tf.Tensor]:
    """The iterator outputs among the sources' keys: their shapes are known only once a step ran."""
    return [t for op in sources if op.type in ITERATORS for t in op.outputs if _partial(t)]


def observed(
    sources: list[tf.Operation], feed_dict: Feeds | None, read: Mapping[str, Sequence[int]] | None = None
) -> Signature | None:
    """The signature a run gives the sources: the placeholders' from its feeds, the iterator outputs' from
    `read` (tensor name -> the shape it had in the run); None when one of them is missing (or has a rank
    or known dimensions that disagree with the graph's)."""
    fed: dict[str, Any] = {}
    for key, value in (feed_dict or {}).items():
        name = getattr(key, "name", key)
        if isinstance(name, str):
            fed[name if ":" in name else f"{name}:0"] = getattr(value, "shape", None) or ()
    given = {**fed, **(read or {})}
    shapes: dict[str, tuple[int, ...]] = {}
    for key, want in partial_shapes(sources).items():
        shape = given.get(key if ":" in key else f"{key}:0")
        if shape is None:
            return None
        shape = tuple(int(d) for d in shape)
        if not tf.TensorShape(want).is_compatible_with(shape):
            return None
        shapes[key] = shape
    return Signature.of(shapes)


def shaped_copy(graph_def: tf.compat.v1.GraphDef, signature: Signature) -> tf.Graph:
    """A fresh graph of `graph_def` (left as it is) whose placeholders have the signature's shapes; TF's
    shape inference gives every other tensor its shape under them."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    wanted = signature.as_dict()
    for node in graph_def.node:
        if node.name in wanted:
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(wanted[node.name]).as_proto())
        elif node.op in ITERATORS:  # TF's shape inference reads an iterator's outputs from this list
            for k, shape in enumerate(node.attr["output_shapes"].list.shape):
                if f"{node.name}:{k}" in wanted:
                    shape.CopyFrom(tf.TensorShape(wanted[f"{node.name}:{k}"]).as_proto())
    copy = tf.Graph()
    with copy.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return copy


def concrete_shapes(
    graph: tf.Graph, signature: Signature, graph_def: tf.compat.v1.GraphDef | None = None
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> fully defined shape, for every tensor whose shape TF leaves partial in `graph` but
    knows once the placeholders have the signature's shapes (TF's shape inference on a copy).
    `graph_def`: `graph`'s, when the caller has it already."""
    copy = shaped_copy(graph.as_graph_def() if graph_def is None else graph_def, signature)
    found: dict[str, tuple[int, ...]] = {}
    for op in graph.get_operations():
        for tensor in op.outputs:
            if tensor.shape.is_fully_defined():
                continue
            shape = copy.get_tensor_by_name(tensor.name).shape
            if shape.is_fully_defined() and tensor.shape.is_compatible_with(shape):
                found[tensor.name] = tuple(int(d) for d in shape.as_list())
    return found


class SignatureBook:
    """The signatures a job's graph ran with, most recent first, in `cache_dir/signatures/<graph key>.json`.
    Nothing here raises: without the book a job only stitches less."""

    def __init__(self, cache_dir: Path, key: str) -> None:
        self.path = Path(cache_dir) / BOOK_DIR / f"{key}.json"

    def recall(self) -> Signature | None:
        """The signature recorded last, None when there is none (or the file is unreadable)."""
        try:
            entries = json.loads(self.path.read_text())["signatures"]
            return Signature.of({name: tuple(shape) for name, shape in entries[0].items()})
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None

    def record(self, signature: Signature) -> bool:
        """Puts `signature` first (atomic rename: concurrent pods never read half a file); False on failure."""
        try:
            entries = json.loads(self.path.read_text())["signatures"] if self.path.is_file() else []
        except (OSError, ValueError, KeyError, TypeError):
            entries = []
        mine = {name: list(shape) for name, shape in signature.shapes}
        entries = [mine, *[e for e in entries if e != mine]][:MAX_SIGNATURES]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps({"signatures": entries}))
            temporary.replace(self.path)
        except OSError as err:
            log.info("stitchfleet: shape signature not recorded: %s", err)
            return False
        return True


class Served(Protocol):
    """What `Specialisation.finished` reads of the job's `signature_kernels.SignatureKernels`."""

    over: int

    def bound(self) -> list[str]: ...


@dataclass(frozen=True)
class ShapeOracle:
    """Tensor shapes under the job's signature and under a second one (`wider`: unknown dimensions larger),
    by original tensor name: two tensors whose shapes agree under both have the same shape for the job's
    feeds (its dimensions are the same functions of the batch), so a shape read of one may read the other.
    Names of the stitched twin (`twin.PREFIX`) read as their originals."""

    first: Mapping[str, tuple[int, ...]]
    second: Mapping[str, tuple[int, ...]]
    prefix: str = TWIN_PREFIX

    def shape(self, tensor: tf.Tensor) -> tuple[int, ...] | None:
        """The tensor's shape under the job's signature (None when not known)."""
        pair = self.pair(tensor)
        return None if pair is None else pair[0]

    def same(self, a: tf.Tensor, b: tf.Tensor) -> bool:
        mine = self.pair(a)
        return mine is not None and mine == self.pair(b)

    def pair(self, tensor: tf.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The tensor's shape under both signatures (None when either is not known)."""
        if tensor.shape.is_fully_defined():
            shape = tuple(int(d) for d in tensor.shape.as_list())
            return shape, shape
        name = tensor.name.removeprefix(f"{self.prefix}/")
        first, second = self.first.get(name), self.second.get(name)
        return None if first is None or second is None else (first, second)


class Specialisation:
    """One job's shape signature: what `begin` specialises its clusters to (`signature`, and `known`: tensor
    name -> shape; empty when the graph is fully shaped), and what its first training step feeds (`learn`),
    which the book keeps for the job's next processes. Without a recorded signature `begin` guesses one
    (`GUESS` for every unknown dimension). Nothing here raises into the job."""

    def __init__(self, graph: tf.Graph, steps: StepOps, cache_dir: Path, ledger: Ledger | None = None) -> None:
        # Only a graph with such sources pays for the training path and the GraphDef (both once).
        self.sources = unknown_sources(graph)
        if self.sources:
            self.sources = unknown_sources(graph, training_path(graph))
        # the graph as begin converted it (`steps`: its ops a training step may run, in order), for rebuilding
        # the clusters under the shapes the job feeds
        self.graph_def = graph.as_graph_def() if self.sources else None
        self.op_names = [op.name for op in steps.get_operations()] if self.sources else []
        # what a copy of the graph loses and its conversion must still know (frontend.context.LiveMarks)
        self.marks = LiveMarks.of(graph, steps.get_operations()) if self.sources else LiveMarks()
        self.book = SignatureBook(cache_dir, graph_key(graph, self.graph_def)) if self.sources else None
        recalled = self.book.recall() if self.book is not None else None
        if recalled is not None and set(recalled.as_dict()) != set(partial_shapes(self.sources)):
            recalled = None  # recorded for other sources: a key collision or a stale file
        self.guessed = recalled is None and bool(self.sources)
        self.signature = _guess(self.sources, self.graph_def) if self.guessed else recalled
        self.known = concrete_shapes(graph, self.signature, self.graph_def) if self.signature is not None else {}
        self.learning = bool(self.sources)
        # The iterator's reads: each training step fetches their shapes (ops added after the GraphDef and the
        # steps' ops were taken, so neither the book's key nor the clusters see them).
        self.read, self.fetches = read_tensors(self.sources), []
        if self.read:
            with graph.as_default(), tf.name_scope("stitchfleet_shapes"):
                self.fetches = [tf.shape(t, out_type=tf.int64) for t in self.read]
        if self.signature is not None:
            how = "a guess until the first training step" if self.guessed else "recorded by the job's earlier runs"
            log.info("stitchfleet: clusters built for the shapes %s (%s)", self.signature.key, how)
        if ledger is not None:
            self.recorded(ledger)

    def recorded(self, ledger: Ledger) -> None:
        """An event saying what the job's clusters were built for (nothing when the graph is fully shaped)."""
        if self.signature is None:
            return
        how = "guessed" if self.guessed else "specialised"
        ledger.event(SHAPE_EVENT, None, None, how, detail=f"clusters built for {self.signature.key}")

    def finished(
        self, ledger: Ledger, step: int, kernels: Sequence[ClusterKernel], served: Served | None = None
    ) -> None:
        """An event with the calls whose shapes no kernel had (TF's ops ran them), if any; `served`: the job's
        `signature_kernels.SignatureKernels`, naming the signatures that had kernels and the steps past the bound."""
        missed = [int(m()) for k in kernels if (m := getattr(k, "missed", None)) is not None]
        if self.signature is None or not any(missed):
            return
        bound = served.bound() if served is not None else [self.signature.key]
        detail = f"{sum(missed)} cluster call(s) of other shapes than {' and '.join(bound) or 'none'} ran TF's ops"
        if served is not None and served.over:
            detail += f"; {served.over} training step(s) fed signatures past STITCHFLEET_SIGNATURES_MAX"
        ledger.event(SHAPE_EVENT, step, None, "other shapes", detail=detail)

    def mark(self, graph: tf.Graph, conversion: Conversion, sites: Sequence[Site]) -> None:
        """Sets each site's `varying`: the folded tensors it reads whose values depend on the signature. They
        are found by converting again under a second signature (`wider`): a
        value that differs, or that cannot be folded there, varies. The rewrite has the cluster's TF ops
        compute those for each call instead of reading the signature's constants."""
        if self.signature is None or not sites:
            return
        try:
            second = concrete_shapes(graph, wider(self.signature, self.sources), self.graph_def)
        except ValueError:  # sources related by the graph (one batch twice another's): both doubled keeps that
            second = concrete_shapes(graph, doubled(self.signature, self.sources), self.graph_def)
        other = convert(StepOps(graph), shapes=second).folded
        oracle = ShapeOracle(self.known, second)
        varying = {
            name
            for name, value in conversion.folded.items()
            if name not in other or np.shape(other[name]) != np.shape(value) or not np.array_equal(other[name], value)
        }
        for site in sites:
            site.varying, site.oracle = frozenset(site.folded) & varying, oracle

    def learn(self, args: tf.compat.v1.train.SessionRunArgs, is_training: Callable[[object], bool]) -> Signature | None:
        """On the job's first training step (`is_training(fetches)`) whose feeds give every source: its signature
        (`learned`). A graph whose iterator is a source learns from the shapes a step read instead."""
        if not self.learning or self.book is None or self.read:
            return None
        try:
            if not is_training(args.fetches):
                return None
            seen = observed(self.sources, args.feed_dict)
        except Exception as err:  # a hint for the next process is never worth a failure
            self.learning = False
            log.info("stitchfleet: shape signature not learned: %s", err)
            return None
        return self.learned(seen) if seen is not None else None

    def learned(self, seen: Signature) -> Signature | None:
        """The first signature a training step gave, recorded in the book for the job's next processes and
        returned; None after the first. What `begin` built for (`signature`, `guessed`) stays as it is:
        kernels for the signatures the job feeds are `signature_kernels`' part (with Horovod it starts
        after this step, and must still know what `begin` built)."""
        if not self.learning or self.book is None:
            return None
        self.learning = False
        if seen != self.signature and not self.guessed and self.signature is not None:
            log.info("stitchfleet: the job feeds %s, not %s as recorded", seen.key, self.signature.key)
        if seen != self.signature or self.guessed:
            self.book.record(seen)
        return seen


def wider(signature: Signature, sources: Sequence[tf.Operation]) -> Signature:
    """The signature with each unknown dimension larger by one plus its axis: a batch (axis 0 of every source)
    grows alike everywhere, so feeds stay consistent, and a batch and a sequence length of the same size (`GUESS`
    for both) differ in the second signature. One larger for all made them the same size under both, so a
    tokens tensor's `[batch, length]` could stand for a `[length, batch]` shape."""
    mine = signature.as_dict()
    return Signature.of(
        {
            key: tuple(
                d + 1 + axis if known is None else d
                for axis, (d, known) in enumerate(zip(mine[key], shape, strict=True))
            )
            for key, shape in partial_shapes(sources).items()
        }
    )


def doubled(signature: Signature, sources: Sequence[tf.Operation]) -> Signature:
    """The signature with each unknown dimension doubled: `wider` where the graph relates its sources' sizes
    (a concatenation of two batches against labels of one placeholder), which adding one would break."""
    mine = signature.as_dict()
    return Signature.of(
        {
            key: tuple(2 * d if known is None else d for d, known in zip(mine[key], shape, strict=True))
            for key, shape in partial_shapes(sources).items()
        }
    )


def _guess(sources: Sequence[tf.Operation], graph_def: tf.compat.v1.GraphDef | None = None) -> Signature:
    """Every unknown dimension of the sources set to GUESS, or, where TF's shape inference on `graph_def` rejects
    that (a graph relating its sources' batches: DCGAN's labels of `[2 x batch]` for a concatenation of two
    batches), a multiple of GUESS per source that it accepts: the fewest sources changed first, at most
    `GUESS_TRIES` tries. ValueError naming the first rejection when none is accepted."""
    partial = partial_shapes(sources)
    unknown = [key for key, shape in partial.items() if None in shape]

    def guess(factors: Mapping[str, int]) -> Signature:
        return Signature.of(
            {
                key: tuple(GUESS * factors.get(key, 1) if d is None else int(d) for d in shape)
                for key, shape in partial.items()
            }
        )

    first = guess({})
    if graph_def is None or not unknown:
        return first
    rejected = None
    for factors in itertools.islice(_multiples(unknown), GUESS_TRIES):
        signature = guess(factors)
        try:
            shaped_copy(graph_def, signature)
        except ValueError as err:
            rejected = rejected or err
            continue
        if factors:
            log.info("stitchfleet: %s rejected (%s); guessed %s", first.key, rejected, signature.key)
        return signature
    raise ValueError(f"no guess of the unknown dimensions passes TF's shape inference: {rejected}")


def _multiples(keys: Sequence[str]) -> Iterator[dict[str, int]]:
    """Per source a factor of GUESS: all 1 first, then each subset of the sources (smallest first) at 2, 3, 4."""
    yield {}
    for size in range(1, len(keys) + 1):
        for factor in (2, 3, 4):
            for chosen in itertools.combinations(keys, size):
                yield dict.fromkeys(chosen, factor)
