"""Sequential's execution order: a ReLU just before a MaxPool2D runs after it, with the same result.

Oracle: the same model (same seed, so the same weights) run strictly in list order
(``reorder=False``). Outputs must be equal and every gradient bitwise equal, on inputs built to
hit the hard cases: many exact ties, all-negative windows, zeros, overlapping and padded pools.
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.layers.activations import ReLU
from dlrun.model import Sequential
from dlrun.layers.order import execution_order
from dlrun.training.trainer import Trainer


def build(specs, input_shape, reorder, dtype=np.float64, seed=3):
    return Sequential([registry.layers.build(s) for s in specs], input_shape, dtype=dtype, seed=seed, reorder=reorder)


class MyReLU(ReLU):
    pass


@pytest.mark.parametrize("names, order", [
    ([{"type": "Conv2D", "filters": 2}, "ReLU", "MaxPool2D", "Flatten"], [0, 2, 1, 3]),
    (["ReLU", "MaxPool2D", "ReLU", "MaxPool2D"], [1, 0, 3, 2]),
    (["ReLU", "ReLU", "MaxPool2D"], [0, 2, 1]),
    (["MaxPool2D", "ReLU", "Flatten"], [0, 1, 2]),            # already pool first
    (["ReLU", "AvgPool2D", "Flatten"], [0, 1, 2]),           # relu(mean) != mean(relu)
    (["LeakyReLU", "MaxPool2D"], [0, 1]),                    # only ReLU itself
    (["ReLU", "Dropout", "MaxPool2D"], [0, 1, 2]),           # only direct neighbours
])
def test_execution_order_swaps_relu_before_max_pool_only(names, order):
    assert execution_order([registry.layers.build(n) for n in names]) == order


def test_a_relu_subclass_is_not_moved():
    assert execution_order([MyReLU(), registry.layers.build("MaxPool2D")]) == [0, 1]


def tied_images(rng, shape):
    """Values in {-2, -1, 0, 1, 2}: most windows hold ties, many are all-negative or zero."""
    return rng.integers(-2, 3, shape).astype(np.float64)


@pytest.mark.parametrize("pool", [
    {"type": "MaxPool2D", "pool_size": 2},
    {"type": "MaxPool2D", "pool_size": 3, "stride": 2},              # overlapping windows
    {"type": "MaxPool2D", "pool_size": 3, "stride": 1, "padding": 1},  # -inf padding
    {"type": "MaxPool2D", "pool_size": [2, 3]},                       # windows not tiling the map
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_reordered_model_gives_the_same_output_and_gradients(pool, dtype):
    rng = np.random.default_rng(0)
    specs = ["ReLU", pool, "Flatten", {"type": "Linear", "units": 3}]
    x = tied_images(rng, (5, 2, 7, 8)).astype(dtype)
    dy = rng.standard_normal((5, 3)).astype(dtype)
    runs = []
    for reorder in (False, True):
        m = build(specs, (2, 7, 8), reorder, dtype)
        assert m.order == ((0, 1, 2, 3) if not reorder else (1, 0, 2, 3))
        out = m.forward(x)
        dx = m.backward(dy)
        runs.append((out, dx, [p.grad.copy() for _, p in m.named_parameters()]))
    (o0, dx0, g0), (o1, dx1, g1) = runs
    np.testing.assert_array_equal(o1, o0)
    np.testing.assert_array_equal(dx1, dx0)
    for a, b in zip(g1, g0):
        np.testing.assert_array_equal(a, b)
    assert np.count_nonzero(dx0) > 0 and np.count_nonzero(dx0 == 0) > 0  # both branches were hit


def test_reordered_conv_net_trains_to_the_same_weights():
    """Fast-mode training (reused buffers, skipped input gradient) with a shuffled last batch."""
    rng = np.random.default_rng(1)
    specs = [{"type": "Conv2D", "filters": 3, "kernel_size": 3}, "ReLU", {"type": "MaxPool2D", "pool_size": 2},
             "Flatten", {"type": "Linear", "units": 4}]
    x, y = rng.standard_normal((37, 1, 9, 9)).astype(np.float32), rng.integers(0, 4, 37)
    weights = []
    for reorder in (False, True):
        m = build(specs, (1, 9, 9), reorder, np.float32)
        opt = registry.optimizers.build({"type": "SGD", "learning_rate": 0.1, "momentum": 0.9})
        Trainer(m, registry.losses.build("SoftmaxCrossEntropy"), opt, None, 8, seed=0).fit(x, y, epochs=3)
        weights.append(m.state_arrays())
    for k in weights[0]:
        np.testing.assert_array_equal(weights[1][k], weights[0][k], err_msg=k)


def test_reordered_relu_sees_the_pooled_map_and_contract_checks_use_it():
    m = build(["ReLU", {"type": "MaxPool2D", "pool_size": 2}], (1, 4, 4), True)
    assert m.order_shapes == [(1, 2, 2), (1, 2, 2)]
    x = np.random.default_rng(2).standard_normal((3, 1, 4, 4))
    m.forward(x)  # the first, checked forward compares each output with order_shapes
    assert m.layers[0].branch_signature().shape == (3, 1, 2, 2)
    assert m.backward(np.ones((3, 1, 2, 2))).shape == (3, 1, 4, 4)


def test_minus_inf_beside_finite_values_no_longer_turns_the_window_into_nan():
    x = np.array([[[[-np.inf, 1.0], [-3.0, 2.0]]]])
    plain, reordered = (build(["ReLU", "MaxPool2D"], (1, 2, 2), r) for r in (False, True))
    with np.errstate(invalid="ignore"):
        assert np.isnan(plain.forward(x)).all()  # ReLU maps -inf to NaN (docs/layers.md)
    assert reordered.forward(x).ravel().tolist() == [2.0]
    assert reordered.backward(np.ones((1, 1, 1, 1))).ravel().tolist() == [0.0, 0.0, 0.0, 1.0]
