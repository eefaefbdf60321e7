"""Graph surgery: per mapped cluster a switch between the stitched op and a clone of its TF ops.

Input: the (not yet finalized) `tf.Graph`, the mapped `Site`s and one callable per site (the `ClusterKernel`).
Output: The rules in full: docs/plugin/graph.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet.plugin.graph import check_reads, cluster_ops, fallback
from stitchfleet.plugin.graph.mapping import Site, check_acyclic
from stitchfleet.plugin.graph.recompute import Size, dimensions, recomputed, same_shape, shape_value
from stitchfleet.plugin.native.dispatch_op import BridgeOp

Kernel = Callable[..., tuple[Any, ...]]
SCOPE = "stitchfleet"


@dataclass
class Installed:
    """One rewired cluster: what the guard fetches to compare both paths on the same inputs."""

    site: Site
    inputs: list[tf.Tensor]
    original: list[tf.Tensor]
    switched: list[tf.Tensor]
    copied: tuple[int, ...] = ()  # inputs read through `check_reads` (a copy on check steps)


@dataclass
class Rewired:
    switches: tf.Tensor
    clusters: list[Installed | str]
    replaced: dict[str, tf.Tensor]
    checking: tf.Tensor | None = None  # bool placeholder: True on check steps (`check_reads`)

    def current(self, tensor: tf.Tensor) -> tf.Tensor:
        """The tensor that now carries `tensor`'s value (its switched output if a cluster produced it)."""
        return self.replaced.get(tensor.name, tensor)


_tensor_name = fallback.tensor_name


def _clone(site: Site, inputs: Sequence[Any], originals: dict[str, str]) -> list[Any]:
    """The cluster's TF ops again, reading `inputs` (inside a cond branch: they run only there).

    `originals` maps earlier clusters' switched outputs back to the tensors they replaced:
    clusters may overlap, so an interior op may have been rerouted to an earlier cluster's
    output that this clone computes itself. (`fallback.function_def` writes the same ops as the
    native bridge's function.)
    """
    # tf.identity captures each outer tensor into the branch; import_graph_def cannot capture.
    captured = [tf.identity(x) for x in inputs]
    feeds = {t.name: (f"in_{j}", x) for j, (t, x) in enumerate(zip(site.inputs, captured, strict=True))}
    # An interior op may already read an earlier cluster's switched output in place of the original.
    feeds.update({x.name: feeds[t.name] for t, x in zip(site.inputs, inputs, strict=True)})
    for j, (name, value) in enumerate(site.folded.items()):
        if name not in site.varying:
            feeds[name] = (f"folded_{j}", tf.constant(value))
    graph_def = tf.compat.v1.GraphDef()
    for placeholder, value in dict(feeds.values()).items():
        node = graph_def.node.add(name=placeholder, op="Placeholder")
        node.attr["dtype"].type = value.dtype.as_datatype_enum
    interior = site.internal_names
    own = {n: o for n, o in originals.items() if o.rsplit(":", 1)[0] in interior}
    chain, renamed = recomputed(site, set(feeds), originals)
    own.update(renamed)
    for op in [*chain, *site.internal]:
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        reads = [own.get(_tensor_name(n), n) for n in node.input if not n.startswith("^")]
        kept = [feeds[_tensor_name(n)][0] if _tensor_name(n) in feeds else n for n in reads]
        del node.input[:]
        node.input.extend(kept)
        if "_class" in node.attr:
            del node.attr["_class"]  # colocation with ops that are not cloned
    input_map = {f"{placeholder}:0": value for placeholder, value in feeds.values()}
    names = [t.name for t in site.outputs]
    return list(tf.graph_util.import_graph_def(graph_def, input_map=input_map, return_elements=names, name="off"))


def _stitched(site: Site, kernel: Kernel, inputs: Sequence[Any]) -> list[Any]:
    dtypes = [t.dtype for t in site.outputs]
    results = tf.numpy_function(kernel, list(inputs), dtypes, stateful=True, name="stitched")
    for value, original in zip(results, site.outputs, strict=True):
        value.set_shape(original.shape)
    return list(results)


def _counter(bridge: BridgeOp, executable: Any, what: str) -> Callable[[], int]:
    """`what` (calls, faulted) of this cluster's entry from now on (the op library counts per entry and process)."""
    start = bridge.count(executable, what)
    return lambda: bridge.count(executable, what) - start


def _dispatched(
    site: Site,
    kernel: Kernel,
    inputs: Sequence[Any],
    originals: dict[str, str],
    *,
    switch: tuple[Any, int],
    bridge: BridgeOp,
) -> list[Any]:
    """One native op: the compiled C when `switch` (vector, index) is on, TF's ops (a function) when off or when
    the C fails."""
    executable = kernel.executable  # type: ignore[attr-defined]
    dtypes = [t.dtype for t in site.outputs]
    function = fallback.define(site, [x.name for x in inputs], originals, tf.compat.v1.get_default_graph())
    static = [t.shape for t in site.outputs]
    outs = bridge.dispatch(executable, inputs, dtypes, switch=switch, fallback=function, static_shapes=static)
    kernel.bridged = _counter(bridge, executable, "calls")  # type: ignore[attr-defined]
    kernel.faulted = _counter(bridge, executable, "faulted")  # type: ignore[attr-defined]
    kernel.missed = _counter(bridge, executable, "missed")  # type: ignore[attr-defined]
    for value, original in zip(outs, site.outputs, strict=True):
        value.set_shape(original.shape)
    return outs


@dataclass(frozen=True)
class OutputValue:
    """One output of a shape reader outside a cluster, computed without the cluster's interior: its static value
    (`sizes` None: the shape of a tensor that does not vary with the signature, or a `Size` of one), else from
    `sizes` (`recompute.dimensions`: the cluster inputs' dimensions, or the read tensor's own when it is outside)."""

    index: int
    kind: str  # "Shape" or "Size"
    sizes: tuple[Size, ...] | None


@dataclass(frozen=True)
class LiveReader:
    """An op outside a cluster reading the shape of a tensor inside it, where that shape depends on the job's shape
    signature: it reads a site input or output of the same shape instead (`reads`: its input position -> that
    tensor), or, when one has none, each of its outputs is computed without it (`values`) and read instead."""

    reads: tuple[tuple[int, tf.Tensor], ...] = ()
    values: tuple[OutputValue, ...] | None = None


def _live_readers(site: Site, candidates: Sequence[Any]) -> dict[str, LiveReader]:
    """Per outside shape reader whose folded value depends on the job's shape signature, how it keeps computing
    its value instead of becoming a constant (`LiveReader`); ValueError when it cannot."""
    live: dict[str, LiveReader] = {}
    for reader in site.shape_readers:
        if not any(t.name in site.varying for t in reader.outputs):
            continue
        inside = [(k, t) for k, t in enumerate(reader.inputs) if t.op.name in site.internal_names]
        try:
            live[reader.name] = LiveReader(reads=tuple((k, same_shape(site, t, candidates)) for k, t in inside))
        except ValueError:
            live[reader.name] = LiveReader(values=tuple(_output_values(site, reader)))
    return live


def _output_values(site: Site, reader: Any) -> list[OutputValue]:
    """Each output of `reader` (`Shape`, `Size`, `ShapeN`) as an `OutputValue`; ValueError for another reader or a
    varying dimension that relates to none of the cluster's inputs. The inputs only: the outputs' shapes are known
    after the cluster ran, and a reader of them feeding the cluster's own gradient half closed a cycle through the
    dispatch op (word2vec's NCE loss)."""
    if reader.type not in ("Shape", "Size", "ShapeN"):
        raise ValueError(f"{reader.name!r} ({reader.type}) reads a shape in the cluster that depends on the signature")
    values = []
    for k, output in enumerate(reader.outputs):
        tensor = reader.inputs[k if reader.type == "ShapeN" else 0]
        kind = "Size" if reader.type == "Size" else "Shape"
        if output.name not in site.varying:
            values.append(OutputValue(k, kind, None))
            continue
        outside = tensor.op.name not in site.internal_names
        values.append(OutputValue(k, kind, tuple(dimensions(site, tensor, [tensor] if outside else site.inputs))))
    return values


def _reroute(
    site: Site, switched: Sequence[Any], anchor: Any, live: dict[str, LiveReader], inputs: Sequence[Any]
) -> None:
    names = site.internal_names
    now = {t.name: s for t, s in [*zip(site.inputs, inputs, strict=True), *zip(site.outputs, switched, strict=True)]}
    for original, replacement in zip(site.outputs, switched, strict=True):
        for reader in list(original.consumers()):
            if reader.name in names:
                continue
            for position, tensor in enumerate(reader.inputs):
                if tensor is original:
                    reader._update_input(position, replacement)
    _reroute_shape_readers(site, live, now)
    for reader in [*site.control_readers, *site.ordering_readers]:
        kept = [c for c in reader.control_inputs if c.name not in names]
        reader._remove_all_control_inputs()
        # a stateful reader still runs after the cluster; a stateless one only lost an ordering edge
        reader._add_control_inputs([*kept, anchor] if reader in site.control_readers else kept)


def _reroute_shape_readers(site: Site, live: dict[str, LiveReader], now: dict[str, Any]) -> None:
    """Outside ops reading interior shapes: a live one reads a tensor of the same shape instead, or its readers read
    its value computed from the inputs' dimensions; the others' readers read their folded constants."""
    for reader in site.shape_readers:
        found = live.get(reader.name)
        if found is not None and found.values is None:
            for position, tensor in found.reads:
                reader._update_input(position, now.get(tensor.name, tensor))
            continue
        if found is not None and found.values is not None:
            for value in found.values:
                output = reader.outputs[value.index]
                if value.sizes is None:
                    _read_instead(output, tf.constant(site.folded[output.name], name="folded"))
                    continue
                with tf.name_scope(f"cluster_{site.index}/shape_of"):
                    read = shape_value(value.sizes, value.kind, output.dtype, lambda c: now.get(c.name, c))
                _read_instead(output, read)
            continue
        for tensor in reader.outputs:
            _read_instead(tensor, tf.constant(site.folded.get(tensor.name, np.asarray(0)), name="folded"))


def _read_instead(tensor: Any, value: Any) -> None:
    """Every op reading `tensor` reads `value` instead."""
    for user in list(tensor.consumers()):
        for position, read in enumerate(user.inputs):
            if read is tensor:
                user._update_input(position, value)


def _install(
    site: Site,
    kernel: Kernel,
    replaced: dict[str, Any],
    *,
    switch: tuple[Any, int],
    bridge: BridgeOp | None,
    checking: Any,
    copies: dict[str, Any],
) -> Installed:
    inputs = [replaced.get(t.name, t) for t in site.inputs]
    check_acyclic(site, inputs)  # through clusters installed before it
    live = _live_readers(site, [*site.inputs, *site.outputs])  # before any change: a ValueError leaves it as it was
    originals = {value.name: name for name, value in replaced.items()}
    with tf.name_scope(f"cluster_{site.index}"):
        inputs, copied = check_reads.taken(inputs, checking, copies)
        if bridge is not None and getattr(kernel, "executable", None) is not None:
            switched = _dispatched(site, kernel, inputs, originals, switch=switch, bridge=bridge)
            anchor = switched[0].op
        else:
            switched = _conditional(site, kernel, switch[0][switch[1]], inputs, originals)
            anchor = switched[0].op.inputs[0].op
    _read_copies(site, inputs, copied)
    _reroute(site, switched, anchor, live, inputs)
    replaced.update({t.name: s for t, s in zip(site.outputs, switched, strict=True)})
    return Installed(site, inputs, list(site.outputs), switched, tuple(copied))


def _read_copies(site: Site, inputs: Sequence[Any], copied: Sequence[int]) -> None:
    """The cluster's own TF ops (the guard's native result on check steps) read the inputs `copied` as the
    stitched op does: the same copy, not the buffer an update may have changed meanwhile."""
    for position in copied:
        old, new = site.inputs[position], inputs[position]
        for op in site.internal:
            for index, tensor in enumerate(op.inputs):
                if tensor is old:
                    op._update_input(index, new)


def _conditional(site: Site, kernel: Kernel, switch: Any, inputs: list[Any], originals: dict[str, str]) -> list[Any]:
    """`tf.cond(switch, numpy_function(kernel), clone of the TF ops)`: the Python bridge's install. Under a
    shape signature the kernel runs only on inputs of the signature's shapes (the native op checks that
    itself)."""
    if site.oracle is not None:
        wanted = [(x, site.oracle.shape(t)) for t, x in zip(site.inputs, inputs, strict=True)]
        same = [tf.reduce_all(tf.equal(tf.shape(x, out_type=tf.int64), shape)) for x, shape in wanted if shape]
        switch = tf.logical_and(switch, tf.reduce_all(tf.stack(same))) if same else switch
    results = tf.cond(switch, lambda: _stitched(site, kernel, inputs), lambda: _clone(site, inputs, originals))
    results = results if isinstance(results, (list, tuple)) else [results]
    switched = [tf.identity(r, name="switched") for r in results]
    for value, original in zip(switched, site.outputs, strict=True):
        value.set_shape(original.shape)
    return switched


def rewire(
    graph: tf.Graph, sites: Sequence[Site], kernels: Sequence[Kernel], bridge: BridgeOp | None = None
) -> Rewired:
    """Installs every site (see the module docstring); the graph must not be finalized. With `bridge`,
    cpu clusters run through the native op instead of tf.numpy_function.

    A site whose cond cannot be built is left as it was (its entry in `clusters` is the
    error text) before anything of it is rerouted; the others are installed.
    """
    with graph.as_default(), tf.name_scope(SCOPE):
        default = np.zeros(len(sites), dtype=bool)
        # one switch per installed site, in order: its length is known only once all are tried
        switches = tf.compat.v1.placeholder_with_default(default, [None], name="switches")
        checking = tf.compat.v1.placeholder_with_default(False, [], name="checking")
        replaced: dict[str, Any] = {}
        for t in {t.name: t for site in sites for t in site.inputs}.values():  # only a CPU kernel's clone reads it
            value = cluster_ops.ignored_value(t)
            if value is not None:
                replaced[t.name] = tf.constant(value, t.dtype, name="ignored")
        copies: dict[str, Any] = {}  # one check-step copy per ref alias, whichever clusters read it
        clusters: list[Installed | str] = []
        for site, kernel in zip(sites, kernels, strict=True):
            installed = sum(isinstance(c, Installed) for c in clusters)
            try:
                clusters.append(
                    _install(
                        site,
                        kernel,
                        replaced,
                        switch=(switches, installed),
                        bridge=bridge,
                        checking=checking,
                        copies=copies,
                    )
                )
            except (ValueError, TypeError, KeyError, tf.errors.OpError) as err:
                clusters.append(f"graph rewrite failed: {type(err).__name__}: {err}")
    for done in clusters:
        if isinstance(done, Installed):
            # A later site may have rerouted this one's inputs: check the values its cond reads.
            done.inputs = [
                done.inputs[j] if j in done.copied else replaced.get(t.name, t) for j, t in enumerate(done.site.inputs)
            ]
    return Rewired(switches, clusters, replaced, checking)
