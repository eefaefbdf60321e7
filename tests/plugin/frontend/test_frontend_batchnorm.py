"""Fused batch norm, forward and gradient, training and inference: the converted IR evaluates to TF's results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import tensorflow as tf

from tests.plugin.tf_harness import check

pytestmark = pytest.mark.tf

P = tf.compat.v1.placeholder
SHAPES = {"NHWC": [4, 3, 5, 6], "NCHW": [4, 6, 3, 5]}


def _batch_norm(
    version: str, training: bool, factor: float, fmt: str = "NHWC", dtype: Any = tf.float32
) -> Callable[[], tuple[list[Any], Any]]:
    """y plus the running statistics broadcast into it, so every output is compared with TF's."""

    def build() -> tuple[list[Any], Any]:
        x = P(dtype, SHAPES[fmt], name="x")
        scale, offset = P(tf.float32, [6], name="scale"), P(tf.float32, [6], name="offset")
        mean, variance = P(tf.float32, [6], name="mean"), tf.abs(P(tf.float32, [6], name="variance")) + 0.5
        op = getattr(tf.raw_ops, version)
        kwargs = {"exponential_avg_factor": factor} if version != "FusedBatchNorm" else {}
        outs = op(
            x=x * tf.constant(3.0, dtype) + tf.constant(1.0, dtype),
            scale=scale,
            offset=offset,
            mean=mean,
            variance=variance,
            epsilon=1e-3,
            is_training=training,
            data_format=fmt,
            **kwargs,
        )
        stats = tf.stop_gradient(outs[1] * 2.0 + outs[2] * 3.0)
        spread = tf.reshape(stats, [1, 6, 1, 1] if fmt == "NCHW" else [1, 1, 1, 6])
        return [x, scale, offset], tf.cast(outs[0], tf.float32) + spread

    return build


CASES = [
    ("V3_train", _batch_norm("FusedBatchNormV3", True, 1.0)),
    ("V3_train_avg", _batch_norm("FusedBatchNormV3", True, 0.01)),
    ("V3_infer", _batch_norm("FusedBatchNormV3", False, 1.0)),
    ("V2_train", _batch_norm("FusedBatchNormV2", True, 1.0)),
    ("V1_train", _batch_norm("FusedBatchNorm", True, 1.0)),
    ("V1_infer", _batch_norm("FusedBatchNorm", False, 1.0)),
    ("V3_train_NCHW", _batch_norm("FusedBatchNormV3", True, 0.5, "NCHW")),
    ("V3_infer_NCHW", _batch_norm("FusedBatchNormV3", False, 1.0, "NCHW")),
    ("V3_train_f16", _batch_norm("FusedBatchNormV3", True, 0.5, dtype=tf.float16)),
]


@pytest.mark.parametrize(("case", "build"), [pytest.param(n, b, id=n) for n, b in CASES])
def test_batch_norm_and_its_gradient_match_tensorflow(case: str, build: Callable[[], tuple[list[Any], Any]]) -> None:
    checked = check(build)
    checked.assert_ok()
    lowered = checked.types("lowered")
    assert any(t.startswith("FusedBatchNorm") and "Grad" not in t for t in lowered), lowered
    assert any(t.startswith("FusedBatchNormGrad") for t in lowered), lowered
    boundaries = {d.op_type for d in checked.conversion.ops.values() if d.fate == "boundary"}
    assert boundaries <= {"Placeholder"}, boundaries
    assert checked.values.checked >= 10
