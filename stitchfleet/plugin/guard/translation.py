"""Before a cluster is installed, its IR is checked against TensorFlow's own ops on the same inputs.

Input: the session-less TF graph in `begin` and the mapped clusters (`Site`: the cluster IR, the TF tensors it
reads and the TF tensors it replaces). Output: per cluster, None (its IR computes what TF computes) or the
reason it is refused, with the figures. The rules in full: docs/plugin/guard.md.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stitchfleet.compiler.blas_threads import one_blas_thread
from stitchfleet.compiler.evaluate import evaluate, random_inputs
from stitchfleet.compiler.ir import DType, fingerprint
from stitchfleet.compiler.tolerance import error_floor, rounding_at, scaled_error
from stitchfleet.plugin.graph.cluster_ops import UNREAD_KEY
from stitchfleet.plugin.graph.mapping import Site
from stitchfleet.plugin.guard import wide_batchnorm
from stitchfleet.plugin.guard.numeric import FLOOR_RATIO, reduction_paths, summation_allowance

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger("stitchfleet.plugin")
SEED = 20261122
F64_ALLOWED = 1e-9  # scaled error between TF's float64 ops and the IR's float64 value: ~1e6 x fp64 roundoff
# An output that is all cancellation (the gradient of a mean subtraction sums to ~0) has no scale of its
# own: its float64 values on both sides are rounding noise, far above F64_ALLOWED once scaled by that
# tiny output. Float64 rounding is ~eps64/eps32 = 2e-9 times the float32 rounding of the same
# computation, so a faithful translation stays below 1e-6 x the float32 error on that output (the larger
# of the IR's and TF's float32 values, a 500x margin); a wrong op is off by its own error, which also
# enters TF's float32 value, so its allowance grows by a millionth of that error only.
F64_PER_F32 = 1e-6
# In the cache key: a pass remembered under an earlier rule is checked again (3: batch norm clusters, once
# judged by the float32 rule, now take the float64 one; 4: so do clusters with integer outputs; 5: a check
# skipped for a float_ref input was cached as a pass). Measuring float16 and float64 outputs' TF rounding
# (TF_ROUNDING) only passes more, and refusals are never remembered: no new rule number.
RULE = 5
CONTEXT = "stitchfleet_context"  # the isolated graph's copies of the producers of unread inputs
OTHER_FLOATS = frozenset({DType.F16, DType.BF16, DType.F64})  # a cluster holding these is compared in float32
# Outputs whose TF rounding the IR's own evaluation understates. TF's CPU kernels sum float16 in float16 (four
# interleaved float16 accumulators: the layer-norm gradient's column sum, bit for bit), the IR's evaluation in
# float32 (as TF's GPU kernels do): its rounding is also measured with float16 sums ("storage"). A float64
# output's IR value is one more float64 order, as TF's is: its rounding is sized from the IR in float32.
TF_ROUNDING = {np.dtype(np.float16): "storage", np.dtype(np.float64): "float32"}


@one_blas_thread  # its spinning workers would slow the job's first steps
def check_sites(graph: tf.Graph, sites: Sequence[Site], factor: float, cache_dir: Path | None = None) -> dict[int, str]:
    """The sites (by cluster index) whose IR disagrees with TF's ops, with why; the others pass. With
    `cache_dir`, a pass is remembered per (TF ops, IR, TF version), so a restarted pod, or a second pod of
    the same job sharing its kernel cache (README, "Setup cost in a pod"), skips the check."""
    refused: dict[int, str] = {}
    for site in sites:
        marker = _marker(graph, site, factor, cache_dir)
        if marker is not None and marker.is_file():
            continue
        reason = _check(graph, site, factor)
        if reason is not None:
            refused[site.index] = reason
        elif marker is not None:
            _remember(marker)
    return refused


def _marker(graph: Any, site: Site, factor: float, cache_dir: Path | None) -> Path | None:
    """The file that records a passed check of this cluster, or None without a cache (or a graph to key)."""
    if cache_dir is None:
        return None
    import tensorflow as tf

    try:
        ops = isolated(graph, site).SerializeToString(deterministic=True)
    except ValueError:
        return None
    key = hashlib.sha256(b"\0".join([ops, fingerprint(site.graph).encode(), tf.__version__.encode()]))
    key.update(f"{factor}:{SEED}:{RULE}".encode())
    return cache_dir / "translation" / f"{key.hexdigest()}.ok"


def _remember(marker: Path) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("passed\n")
    except OSError as err:  # a read-only cache only costs the check next time
        log.info("stitchfleet: translation check not cached: %s", err)


def isolated(graph: tf.Graph, site: Site) -> tf.compat.v1.GraphDef:
    """A GraphDef of the cluster's TF ops alone: its inputs become placeholders `stitchfleet_in_K`, a
    value the frontend folded (a shape computation, a constant) becomes a constant, and control edges
    and colocation constraints into it are dropped (ordering only: gradient code reaches the whole
    training step through them). An input the IR does not read but TF's ops do (batch norm's reserve
    spaces, which the gradient's lowering recomputes from x) is computed by a copy of its producer
    from the same placeholders (`_derived`), so both sides see values that belong together."""
    import tensorflow as tf

    internal = {op.name for op in site.internal}
    fed = {tensor.name: f"stitchfleet_in_{k}" for k, tensor in enumerate(site.inputs)}
    out = tf.compat.v1.GraphDef()
    derived = _derived(site)
    for k, tensor in enumerate(site.inputs):
        if k in derived:
            continue
        node = out.node.add(name=f"stitchfleet_in_{k}", op="Placeholder")
        node.attr["dtype"].type = tensor.dtype.base_dtype.as_datatype_enum  # a ref variable: its value
        node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
    for k, op in derived.items():
        _add_producer(out, op, fed)
        node = out.node.add(name=f"stitchfleet_in_{k}", op="Identity", input=[f"{CONTEXT}/{site.inputs[k].name}"])
        node.attr["T"].type = site.inputs[k].dtype.base_dtype.as_datatype_enum
    constants: dict[str, str] = {}
    for op in site.internal:
        node = out.node.add()
        node.CopyFrom(op.node_def)
        del node.input[:]
        for name in op.node_def.input:
            if name.startswith("^"):
                continue
            tensor = name if ":" in name else f"{name}:0"
            if tensor in fed:
                node.input.append(fed[tensor])
            elif tensor.rsplit(":", 1)[0] in internal:
                node.input.append(name)
            else:
                node.input.append(_constant(out, graph, site, tensor, constants))
    for node in out.node:
        node.ClearField("device")
        if "_class" in node.attr:
            del node.attr["_class"]
    return out


def _derived(site: Site) -> dict[int, Any]:
    """The unread inputs (`interior.UNREAD_KEY`) with a stateless producer, by input position: the
    isolated graph computes them (a variable read, which the TF ops ignore, stays a random placeholder)."""
    count = site.graph.metadata.get_int(UNREAD_KEY) if UNREAD_KEY in site.graph.metadata else 0
    first = len(site.inputs) - count
    found: dict[int, Any] = {}
    for k in range(first, len(site.inputs)):
        op = site.inputs[k].op
        if op.op_def is not None and not op.op_def.is_stateful and op.inputs and not op.control_inputs:
            found[k] = op
    return found


def _add_producer(out: Any, op: Any, fed: dict[str, str]) -> None:
    """`op` copied into `out` as `CONTEXT/op`, reading the cluster's placeholders where it reads the
    cluster's inputs and a placeholder `CONTEXT/op/in_J` (fed random values, `_context_values`) elsewhere."""
    name = f"{CONTEXT}/{op.name}"
    if any(node.name == name for node in out.node):
        return
    node = out.node.add()
    node.CopyFrom(op.node_def)
    node.name = name
    del node.input[:]
    for j, tensor in enumerate(op.inputs):
        if tensor.name in fed:
            node.input.append(fed[tensor.name])
            continue
        placeholder = out.node.add(name=f"{name}/in_{j}", op="Placeholder")
        placeholder.attr["dtype"].type = tensor.dtype.base_dtype.as_datatype_enum
        placeholder.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
        node.input.append(placeholder.name)


def _context_values(graph_def: Any, seed: int, fed: dict[str, Any] | None = None) -> dict[str, Any]:
    """Random values (normal floats, small ints) for the placeholders `_add_producer` made, by tensor name; a
    batch norm's scale, offset or statistics of unknown size get its input's channel count (`_channels`)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    values: dict[str, Any] = {}
    channels = _channels(graph_def, fed or {})
    for node in graph_def.node:
        if node.op != "Placeholder" or not node.name.startswith(f"{CONTEXT}/"):
            continue
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type).as_numpy_dtype
        shape = [int(d.size) if d.size >= 0 else 1 for d in node.attr["shape"].shape.dim]  # a (0,) stays empty
        if node.name in channels and len(shape) == 1 and node.attr["shape"].shape.dim[0].size < 0:
            shape = [channels[node.name]]
        raw = rng.standard_normal(shape) if np.issubdtype(dtype, np.floating) else rng.integers(-8, 8, shape)
        values[f"{node.name}:0"] = np.asarray(raw).astype(dtype)
    return values


def _channels(graph_def: Any, fed: dict[str, Any]) -> dict[str, int]:
    """Per placeholder feeding a FusedBatchNorm's scale, offset, mean or variance: the channel count of the
    value fed as its x (Keras' layer norm under a `None` batch: its scale and offset have batch x time
    elements, unknown statically; one random element made the check fail, 'offset must have the same
    number of elements as the channels of x')."""
    found: dict[str, int] = {}
    for node in graph_def.node:
        if not node.op.startswith("FusedBatchNorm") or not node.input:
            continue
        x = fed.get(node.input[0] if ":" in node.input[0] else f"{node.input[0]}:0")
        if x is None or np.ndim(x) < 2:
            continue
        nchw = node.attr["data_format"].s.decode().startswith("NC") if "data_format" in node.attr else False
        count = int(np.shape(x)[1] if nchw else np.shape(x)[-1])
        for name in node.input[1:5]:
            found[name.split(":")[0]] = count
    return found


def _constant(out: Any, graph: Any, site: Site, tensor: str, made: dict[str, str]) -> str:
    """A constant node in `out` holding an outside value the cluster reads (folded or a Const)."""
    import tensorflow as tf

    if tensor not in made:
        if tensor in site.folded:
            value = np.asarray(site.folded[tensor])
        elif graph.get_tensor_by_name(tensor).op.type == "Const":
            value = tf.make_ndarray(graph.get_tensor_by_name(tensor).op.get_attr("value"))
        else:
            raise ValueError(f"the cluster reads {tensor} from outside and it is neither an input nor a constant")
        dtype = graph.get_tensor_by_name(tensor).dtype
        made[tensor] = f"stitchfleet_const_{len(made)}"
        node = out.node.add(name=made[tensor], op="Const")
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(dtype.as_numpy_dtype)))
    return made[tensor]


def _run(graph_def: Any, site: Site, values: dict[str, Any], *, optimized: bool = True) -> list[Any]:
    """TF's values of the site's outputs from `graph_def` (an isolated cluster) on `values`. `optimized`
    False runs it without grappler: for the float64 reference, whose rewrites could change only its
    rounding, and whose optimisation in a new session each time cost ~25 ms a cluster."""
    import tensorflow as tf

    names = [str(p.attrs["name"]) for p in site.graph.parameters]
    derived = _derived(site)
    with tf.Graph().as_default() as alone:
        tf.compat.v1.import_graph_def(graph_def, name="")
        feeds = {f"stitchfleet_in_{k}:0": values[name] for k, name in enumerate(names) if k not in derived}
        feeds.update(_context_values(graph_def, SEED + site.index, feeds))
        with tf.compat.v1.Session(graph=alone, config=None if optimized else _plain_config()) as session:
            return list(session.run([tensor.name for tensor in site.outputs], feed_dict=feeds))


def _plain_config() -> Any:
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def promoted(graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
    """A copy of `graph_def` computing in float64 where it computed in float32 (type attrs, constants);
    fused batch norms, which have no float64 kernel, become their float64 formulas (`wide_batchnorm`)."""
    import tensorflow as tf

    float32, float64 = tf.float32.as_datatype_enum, tf.float64.as_datatype_enum
    out = tf.compat.v1.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        for value in node.attr.values():
            if value.HasField("type") and value.type == float32:
                value.type = float64
            elif value.HasField("list") and float32 in value.list.type:
                types = [float64 if t == float32 else t for t in value.list.type]
                del value.list.type[:]
                value.list.type.extend(types)
            elif value.HasField("tensor") and value.tensor.dtype == float32:
                array = tf.make_ndarray(value.tensor).astype(np.float64)
                value.tensor.CopyFrom(tf.make_tensor_proto(array))
    return wide_batchnorm.widened(out)


def _in_float64(
    site: Site, values: dict[str, Any], isolated_def: Any, tf_single: list[Any], ir: tuple[Any, Any]
) -> str | bool | None:
    """The float64 comparison: a reason, None (faithful), or False when it cannot be made (see the module
    docstring: other float types or casts, an op without a float64 kernel). `tf_single`: TF's float32 values
    of the outputs; `ir`: the IR's float32 and float64 values (both rules read them: computed once)."""
    import tensorflow as tf

    kinds = {n.dtype for n in site.graph.nodes}
    if kinds & OTHER_FLOATS or any(op.type == "Cast" for op in site.internal):
        return False
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in values.items()}
    try:
        got = _run(promoted(isolated_def), site, wide, optimized=False)
    except (tf.errors.OpError, ValueError, TypeError, KeyError):
        return False
    single, double = ir  # the same values: float32 ones widen exactly
    for (name, _), tf_value, tf_32 in zip(site.graph.outputs, got, tf_single, strict=True):
        output_check = _output_in_float64(name, np.asarray(tf_value), tf_32, single[name], double[name])
        if output_check is not None:
            return output_check
    return None


def _output_in_float64(name: str, value: Any, tf_32: Any, single: Any, double: Any) -> str | bool | None:
    """One output: TF's float64 `value` against the IR's float64 `double` (None: faithful), a reason, or False
    when it cannot be compared so (a shape TF and the IR disagree on: the float32 comparison says how)."""
    reference = np.asarray(double, dtype=np.float64)
    if value.dtype.kind in "iub":  # a step counter's `+ 1` joined by remote stitching, shape arithmetic: exactly TF's
        same = np.array_equal(np.asarray(tf_32), np.asarray(single))
        return None if same else f"translation differs from TF: integer output {name} is not TF's"
    if value.dtype.kind != "f" or value.shape != reference.shape:
        return False
    if not np.array_equal(np.isfinite(reference), np.isfinite(value)):
        return f"translation differs from TF: output {name} is finite where TF's is not (or the other way)"
    floor = error_floor(reference, FLOOR_RATIO)
    error = scaled_error(value, reference, floor)
    rounding = max(scaled_error(np.asarray(x), reference, floor) for x in (single, tf_32))
    allowed = max(F64_ALLOWED, F64_PER_F32 * rounding)
    if error > allowed:
        return (
            f"translation differs from TF: output {name} is {error:.3g} from TF's float64 ops ({allowed:.3g} allowed)"
        )
    return None


def _check(graph: Any, site: Site, factor: float) -> str | None:
    import tensorflow as tf

    values = _known(site, _sized(site.graph, random_inputs(site.graph, SEED + site.index)))
    try:
        isolated_def = isolated(graph, site)
        got = _run(isolated_def, site, values)  # TF's float32 values: the float64 rule reads them too
    except (tf.errors.OpError, ValueError, TypeError, KeyError) as err:
        failed = f"translation check could not run: {type(err).__name__}: {_first_line(err)}"
        log.debug("stitchfleet: cluster %d: %s", site.index, err)
        log.warning("stitchfleet: cluster %d stays with TF: %s", site.index, failed)
        return failed
    single = evaluate(site.graph, values)
    double = evaluate(site.graph, values, "float64")
    wide = _in_float64(site, values, isolated_def, got, (single, double))
    if wide is not False:
        return wide if isinstance(wide, str) else None
    paths = reduction_paths(site.graph)
    kinds = {np.asarray(v).dtype for v in got}
    other = {p: evaluate(site.graph, values, p) for d, p in TF_ROUNDING.items() if d in kinds}  # type: ignore[arg-type]
    for (name, _), tf_value in zip(site.graph.outputs, got, strict=True):
        precision = TF_ROUNDING.get(np.asarray(tf_value).dtype)
        ir = (single[name], double[name], other[precision][name] if precision else None)
        reason = _compare(name, np.asarray(tf_value), ir, paths[name], factor=factor)
        if reason is not None:
            return reason
    return None


def _sized(ir: Any, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with a zero-size input empty, as TF's placeholder of that static shape takes it (random_inputs
    gives every dimension at least 1; word2vec's NCE cluster reads a (0,) tensor, and its check could not run)."""
    for parameter in ir.parameters:
        if 0 in parameter.shape:
            name = str(parameter.attrs["name"])
            values[name] = np.zeros(tuple(max(d, 0) if d >= 0 else 1 for d in parameter.shape), values[name].dtype)
    return values


def _known(site: Site, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each integer input TF can evaluate statically (a gradient's Reshape shape, an axis) set to
    that value: random integers there made TF's ops fail ('Size 0 must be non-negative, not -4'), and such a
    check, once skipped, now leaves its cluster with TF (Keras' batch-norm CNN lost 2 of its 6 clusters)."""
    import tensorflow as tf

    names = [str(p.attrs["name"]) for p in site.graph.parameters]
    for name, tensor in zip(names, site.inputs, strict=False):
        if tensor.dtype.base_dtype.is_floating or tensor.dtype.base_dtype == tf.resource:
            continue
        known = tf.get_static_value(tensor)
        if known is not None and np.shape(known) == np.shape(values[name]):
            values[name] = np.asarray(known).astype(values[name].dtype)
    return values


def _first_line(err: Exception) -> str:
    """The error's own words: TF's 'Graph execution error:' header and its stack lines left out."""
    lines = [line.strip() for line in str(getattr(err, "message", None) or err).splitlines()]
    useful = [
        line
        for line in lines
        if line
        and not line.startswith(("Graph execution error", "Detected at", "File", "[[", "Original stack", "Node:"))
    ]
    return (useful[0] if useful else type(err).__name__)[:300]


def _compare(
    name: str, tf_value: np.ndarray[Any, Any], ir: tuple[Any, Any, Any], lengths: list[int], *, factor: float
) -> str | None:
    """Why TF's value of one output is not the IR's (`ir`: its values in the output's precision, in float64
    and, for `TF_ROUNDING` outputs, in that precision), or None when it is (within TF's own rounding)."""
    single, double, other = ir
    reference = np.asarray(double, dtype=np.float64)
    if tf_value.shape != reference.shape:
        shapes = f"{tf_value.shape} in TF, {reference.shape} in the IR"
        return f"translation differs from TF: output {name} has shape {shapes}"
    if tf_value.dtype.kind != "f":
        same = np.array_equal(tf_value, np.asarray(single))
        return None if same else f"translation differs from TF: integer output {name} is not TF's"
    finite = np.isfinite(reference)
    if not np.array_equal(finite, np.isfinite(tf_value.astype(np.float64))):
        return f"translation differs from TF: output {name} is finite where TF's is not (or the other way)"
    floor = error_floor(reference, FLOOR_RATIO)
    error = scaled_error(tf_value, reference, floor)
    own = scaled_error(np.asarray(single), reference, floor)
    if other is not None and tf_value.dtype == np.float16:
        own = max(own, scaled_error(np.asarray(other), reference, floor))
    elif other is not None and tf_value.dtype == np.float64:
        own = max(own, rounding_at(tf_value.dtype, np.asarray(other), reference, floor))
    allowed = max(summation_allowance(tf_value.dtype, lengths, factor), factor * own)
    if error <= allowed:
        return None
    return f"translation differs from TF: output {name} is {error:.3g} from TF's ops ({allowed:.3g} allowed)"
