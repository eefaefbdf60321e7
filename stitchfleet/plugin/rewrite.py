"""Graph surgery: per mapped cluster a switch between the stitched op and a clone of its TF ops.

Input: the (not yet finalized) `tf.Graph`, the mapped `Site`s and one callable per site
(the `ClusterKernel`). Output: `Rewired`: the switch vector placeholder (a bool per
installed cluster, in order, default all off, fed each step through SessionRunArgs), and
per cluster the tensors the guard fetches on check steps (or why it was left off: a cond
that cannot be built, or one that would close a cycle through clusters installed before).
For each site the graph gets one switchable node, and only the chosen path runs: with the
native bridge, the `StitchfleetDispatch` op (`bridge_op`: the compiled C called from TF, no
Python; its switch off, it runs a graph function holding a clone of the cluster's TF ops);
otherwise `tf.cond(switch[k], tf.numpy_function(kernel), clone of the TF ops)`. Every outside
reader of every cluster output (forward, gradient and optimizer ops alike) is rerouted to the
switched result; control edges on the cluster's ops move to it; outside ops that only read
interior shapes are replaced by their folded constants. The original ops stay in the graph,
unread, as the check path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from stitchfleet.plugin.bridge_op import BridgeOp
from stitchfleet.plugin.sites import Site, check_acyclic

Kernel = Callable[..., tuple[Any, ...]]
SCOPE = "stitchfleet"


@dataclass
class Installed:
    """One rewired cluster: what the guard fetches to compare both paths on the same inputs."""

    site: Site
    inputs: list[Any]
    original: list[Any]
    switched: list[Any]


@dataclass
class Rewired:
    switches: Any
    clusters: list[Installed | str]
    replaced: dict[str, Any]

    def current(self, tensor: Any) -> Any:
        """The tensor that now carries `tensor`'s value (its switched output if a cluster produced it)."""
        return self.replaced.get(tensor.name, tensor)


def _tensor_name(text: str) -> str:
    return text if ":" in text else f"{text}:0"


def _clone(site: Site, inputs: Sequence[Any], originals: dict[str, str], outer: Sequence[str] = ()) -> list[Any]:
    """The cluster's TF ops again, reading `inputs` (inside a cond branch: they run only there).

    `originals` maps earlier clusters' switched outputs back to the tensors they replaced:
    clusters may overlap, so an interior op may have been rerouted to an earlier cluster's
    output that this clone computes itself. `outer` names the tensors `inputs` stand for when
    they are a function's arguments (interior ops name the outer tensors they read).
    """
    # tf.identity captures each outer tensor into the branch; import_graph_def cannot capture.
    captured = [tf.identity(x) for x in inputs]
    feeds = {t.name: (f"in_{j}", x) for j, (t, x) in enumerate(zip(site.inputs, captured, strict=True))}
    # An interior op may already read an earlier cluster's switched output in place of the original.
    read = outer or [x.name for x in inputs]
    feeds.update({name: feeds[t.name] for t, name in zip(site.inputs, read, strict=True)})
    for j, (name, value) in enumerate(site.folded.items()):
        feeds[name] = (f"folded_{j}", tf.constant(value))
    graph_def = tf.compat.v1.GraphDef()
    for placeholder, value in dict(feeds.values()).items():
        node = graph_def.node.add(name=placeholder, op="Placeholder")
        node.attr["dtype"].type = value.dtype.as_datatype_enum
    interior = site.internal_names
    own = {n: o for n, o in originals.items() if o.rsplit(":", 1)[0] in interior}
    for op in site.internal:
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


def _fallback(site: Site, inputs: Sequence[Any], originals: dict[str, str]) -> Any:
    """The cluster's TF ops as a graph function: what the dispatch op runs when its switch is off."""
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in site.inputs]
    outer = [x.name for x in inputs]

    def body(*args: Any) -> list[Any]:
        return _clone(site, args, originals, outer)

    return tf.function(body, autograph=False).get_concrete_function(*specs)


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
    outs = bridge.dispatch(executable, inputs, dtypes, switch=switch, fallback=_fallback(site, inputs, originals))
    kernel.bridged = _counter(bridge, executable, "calls")  # type: ignore[attr-defined]
    kernel.faulted = _counter(bridge, executable, "faulted")  # type: ignore[attr-defined]
    for value, original in zip(outs, site.outputs, strict=True):
        value.set_shape(original.shape)
    return outs


def _reroute(site: Site, switched: Sequence[Any], anchor: Any) -> None:
    names = site.internal_names
    for original, replacement in zip(site.outputs, switched, strict=True):
        for reader in list(original.consumers()):
            if reader.name in names:
                continue
            for position, tensor in enumerate(reader.inputs):
                if tensor is original:
                    reader._update_input(position, replacement)
    for reader in site.shape_readers:
        for tensor in reader.outputs:
            constant = tf.constant(site.folded.get(tensor.name, np.asarray(0)), name="folded")
            for user in list(tensor.consumers()):
                for position, read in enumerate(user.inputs):
                    if read is tensor:
                        user._update_input(position, constant)
    for reader in [*site.control_readers, *site.ordering_readers]:
        kept = [c for c in reader.control_inputs if c.name not in names]
        reader._remove_all_control_inputs()
        # a stateful reader still runs after the cluster; a stateless one only lost an ordering edge
        reader._add_control_inputs([*kept, anchor] if reader in site.control_readers else kept)


def _install(
    site: Site, kernel: Kernel, replaced: dict[str, Any], *, switch: tuple[Any, int], bridge: BridgeOp | None
) -> Installed:
    inputs = [replaced.get(t.name, t) for t in site.inputs]
    check_acyclic(site, inputs)  # through clusters installed before it
    originals = {value.name: name for name, value in replaced.items()}
    with tf.name_scope(f"cluster_{site.index}"):
        if bridge is not None and getattr(kernel, "executable", None) is not None:
            switched = _dispatched(site, kernel, inputs, originals, switch=switch, bridge=bridge)
            anchor = switched[0].op
        else:
            switched = _conditional(site, kernel, switch[0][switch[1]], inputs, originals)
            anchor = switched[0].op.inputs[0].op
    _reroute(site, switched, anchor)
    replaced.update({t.name: s for t, s in zip(site.outputs, switched, strict=True)})
    return Installed(site, inputs, list(site.outputs), switched)


def _conditional(site: Site, kernel: Kernel, switch: Any, inputs: list[Any], originals: dict[str, str]) -> list[Any]:
    """`tf.cond(switch, numpy_function(kernel), clone of the TF ops)`: the Python bridge's install."""
    results = tf.cond(switch, lambda: _stitched(site, kernel, inputs), lambda: _clone(site, inputs, originals))
    results = results if isinstance(results, (list, tuple)) else [results]
    switched = [tf.identity(r, name="switched") for r in results]
    for value, original in zip(switched, site.outputs, strict=True):
        value.set_shape(original.shape)
    return switched


def rewire(graph: Any, sites: Sequence[Site], kernels: Sequence[Kernel], bridge: BridgeOp | None = None) -> Rewired:
    """Installs every site (see the module docstring); the graph must not be finalized. With `bridge`,
    cpu clusters run through the native op instead of tf.numpy_function.

    A site whose cond cannot be built is left as it was (its entry in `clusters` is the
    error text) before anything of it is rerouted; the others are installed.
    """
    with graph.as_default(), tf.name_scope(SCOPE):
        default = np.zeros(len(sites), dtype=bool)
        # one switch per installed site, in order: its length is known only once all are tried
        switches = tf.compat.v1.placeholder_with_default(default, [None], name="switches")
        replaced: dict[str, Any] = {}
        clusters: list[Installed | str] = []
        for site, kernel in zip(sites, kernels, strict=True):
            installed = sum(isinstance(c, Installed) for c in clusters)
            try:
                clusters.append(_install(site, kernel, replaced, switch=(switches, installed), bridge=bridge))
            except (ValueError, TypeError, KeyError, tf.errors.OpError) as err:
                clusters.append(f"graph rewrite failed: {type(err).__name__}: {err}")
    for done in clusters:
        if isinstance(done, Installed):
            # A later site may have rerouted this one's inputs: check the values its cond reads.
            done.inputs = [replaced.get(t.name, t) for t in done.site.inputs]
    return Rewired(switches, clusters, replaced)
