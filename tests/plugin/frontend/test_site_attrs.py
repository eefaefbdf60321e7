"""A lowering rule reads a TF op's attributes through typed readers: the value TF holds, the default when the
op has none, and a LoweringError naming the attribute when it holds another kind of value (the op then stays
with TF as a boundary, as for any op the frontend cannot lower)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from stitchfleet.plugin.frontend.context import LoweringError, Site  # noqa: E402

pytestmark = pytest.mark.tf


def _site(build: str) -> Site:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        op = {
            "pack": lambda: tf.raw_ops.Pack(values=[x, x], axis=1, name="op"),
            "leaky": lambda: tf.raw_ops.LeakyRelu(features=x, alpha=0.3, name="op"),
            "squeeze": lambda: tf.raw_ops.Squeeze(input=tf.reshape(x, [2, 1, 3]), axis=[1], name="op"),
        }[build]().op
    return Site(op, [], [], None)  # no lowering: the readers use the op alone


def test_the_readers_give_what_tf_holds() -> None:
    assert _site("pack").integer("axis") == 1
    assert _site("leaky").number("alpha", 0.2) == pytest.approx(0.3)
    assert _site("squeeze").integers("squeeze_dims") == [1]


def test_an_absent_attribute_gives_the_default() -> None:
    assert _site("leaky").integer("axis", 4) == 4
    assert _site("pack").number("epsilon", 1e-4) == 1e-4
    assert _site("pack").integers("squeeze_dims") == []


def test_an_attribute_of_another_kind_is_named() -> None:
    with pytest.raises(LoweringError, match=r"attribute 'T' .* not an int"):
        _site("pack").integer("T")  # a dtype
    with pytest.raises(LoweringError, match=r"attribute 'T' .* not a number"):
        _site("leaky").number("T", 0.0)
    with pytest.raises(LoweringError, match=r"attribute 'axis' .* not a list of ints"):
        _site("pack").integers("axis")
