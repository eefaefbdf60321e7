"""Lowering rules for TF's fused batch norm, forward and gradient, training and inference forms.

Input: a `Site` for FusedBatchNorm/V2/V3 or FusedBatchNormGrad/V2/V3. The rules in full:
docs/plugin/frontend.md.
"""

from __future__ import annotations

from stitchfleet.compiler.ir import Value
from stitchfleet.plugin.frontend import kernel_library
from stitchfleet.plugin.frontend.context import LoweringError, Rule, Site

FORWARD = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
GRADIENT = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")
# Outputs the rules give no IR value: V3's reserve_space_3 (no static rank; only V3's gradient
# reads it, and the rule never does) and the gradients' two placeholder outputs (nothing reads them: an
# empty [0] from TF's Eigen CPU kernel, a scalar 0 from oneDNN's)
UNBOUND_OUTPUTS = {"FusedBatchNormV3": frozenset({5}), **dict.fromkeys(GRADIENT, frozenset({3, 4}))}
UNREAD_OPERANDS = {"FusedBatchNormGradV3": frozenset({5})}
# The rank of an unbound output that TF gives no static shape: V3's reserve_space_3 is a flat buffer
# (empty from oneDNN's CPU kernel, cuDNN's workspace on a GPU). A cluster holding the gradient but not the
# forward takes it as an input its IR never reads (`cluster_ops.with_unread`), declared with this rank and
# unknown length; the dispatch op runs the kernel only for inputs of that rank (`unbound_rank`).
UNBOUND_RANKS = {"FusedBatchNormV3": {5: 1}}
# TF's Eigen CPU kernel (oneDNN off) allocates reserve_space_3 as a scalar it never writes: declared rank 1
# there, every call missed its kernel and ran TF's ops (the MLP's layer-norm gradient cluster, 0 calls).
EIGEN_CPU_RANKS = {"FusedBatchNormV3": {5: 0}}
RESERVE_OUTPUTS = (3, 4, 5)
SHAPE_READERS = frozenset({"ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank"})


def unbound_rank(op_type: str, index: int, *, on_gpu: bool) -> int | None:
    """The rank of output `index` of a TF op of `op_type` that TF's shape function leaves unknown, as the
    kernel that runs it here returns it (None: not an unbound output this module knows)."""
    ranks = UNBOUND_RANKS if on_gpu or kernel_library.onednn() else EIGEN_CPU_RANKS
    return ranks.get(op_type, {}).get(index)


class _Layout:
    """The channel axis, the reduced axes and the element count per channel of x."""

    def __init__(self, site: Site, x: Value) -> None:
        fmt = site.attr("data_format", b"NHWC")
        text = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        rank = len(x.shape)
        self.shape = x.shape
        self.axis = 1 if text.startswith("NC") else rank - 1
        self.reduced = tuple(i for i in range(rank) if i != self.axis)
        self.count = 1
        for i in self.reduced:
            self.count *= x.shape[i]

    def spread(self, site: Site, channel: Value) -> Value:
        """A per-channel vector broadcast over x's shape."""
        return site.b.broadcast(channel, self.shape, (self.axis,))


def _stats(site: Site, xf: Value, layout: _Layout) -> tuple[Value, Value, Value]:
    """Batch mean, x minus it, and the biased batch variance."""
    b = site.b
    mean = b.reduce_mean(xf, layout.reduced)
    centred = xf - layout.spread(site, mean)
    return mean, centred, b.reduce_mean(b.square(centred), layout.reduced)


def _check_reserve_readers(site: Site) -> None:
    for index in RESERVE_OUTPUTS[: len(site.op.outputs) - 3]:
        for consumer in site.op.outputs[index].consumers():
            # tf.gradients' ZerosLike for an undifferentiated output reads only the shape
            if consumer.type not in GRADIENT and consumer.type not in SHAPE_READERS:
                raise LoweringError(f"reserve space read by {consumer.type} (device-specific content)")


def _forward(site: Site) -> list[Value]:
    b = site.b
    x, scale, offset = site.value(0), site.value(1), site.value(2)
    layout, eps = _Layout(site, x), site.number("epsilon", 1e-4)
    xf = b.cast(x, scale.dtype)
    if site.attr("is_training", True):
        _check_reserve_readers(site)
        mean, centred, variance = _stats(site, xf, layout)
        factor = site.number("exponential_avg_factor", 1.0)
        corrected = variance * (layout.count / max(layout.count - 1, 1))
        if factor == 1.0:  # the old statistics may be empty tensors then: never read them
            running_mean, running_variance = mean, corrected
        else:
            running_mean = site.value(3) * (1.0 - factor) + mean * factor
            running_variance = site.value(4) * (1.0 - factor) + corrected * factor
        saved = [mean, variance]
    else:
        mean, variance = site.value(3), site.value(4)
        centred = xf - layout.spread(site, mean)
        running_mean, running_variance = mean, variance
        saved = [mean, variance]
    gain = b.rsqrt(variance + eps) * scale
    y = b.cast(centred * layout.spread(site, gain) + layout.spread(site, offset), x.dtype)
    return [y, running_mean, running_variance, *saved]


def _gradient(site: Site) -> list[Value]:
    b = site.b
    dy, x, scale = site.value(0), site.value(1), site.value(2)
    layout, eps = _Layout(site, x), site.number("epsilon", 1e-4)
    dyf, xf = b.cast(dy, scale.dtype), b.cast(x, scale.dtype)
    sum_dy = b.reduce_sum(dyf, layout.reduced)
    if site.attr("is_training", True):
        _, centred, variance = _stats(site, xf, layout)
        inv = b.rsqrt(variance + eps)
        sum_dy_centred = b.reduce_sum(dyf * centred, layout.reduced)
        mean_dy, mean_dy_centred = sum_dy / float(layout.count), sum_dy_centred / float(layout.count)
        inner = dyf - layout.spread(site, mean_dy) - centred * layout.spread(site, inv * inv * mean_dy_centred)
        x_backprop = inner * layout.spread(site, scale * inv)
    else:  # reserve_space_1/2 hold the population mean and variance here, on every device
        mean, variance = site.value(3), site.value(4)
        inv = b.rsqrt(variance + eps)
        centred = xf - layout.spread(site, mean)
        sum_dy_centred = b.reduce_sum(dyf * centred, layout.reduced)
        x_backprop = dyf * layout.spread(site, scale * inv)
    return [b.cast(x_backprop, x.dtype), sum_dy_centred * inv, sum_dy]


RULES: dict[str, Rule] = {**dict.fromkeys(FORWARD, _forward), **dict.fromkeys(GRADIENT, _gradient)}
