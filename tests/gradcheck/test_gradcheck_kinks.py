"""`--detect-kinks`: generic detection of kinks a layer declares no branch_signature for.

A kink inside [θ−h, θ+h] makes the central difference meaningless; the quadratic fitted through
θ, θ±h/2, θ±h tells it from a smooth function. The plugin below is ReLU without a signature;
with a step of 0.05 several of its N(0,1) inputs sit within a step of the kink.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write

from dlrun.gradcheck import Settings, check_all
from dlrun.gradcheck.kinks import KinkTest, nondifferentiable

PLAIN_RELU = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class PlainReLU(Layer):
    """max(x, 0) with no branch_signature."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy):
        return dy * self._mask
'''

F64 = KinkTest(1e-5, 1e-3, np.dtype(np.float64))
H = 1e-6
TS = np.array([-H, -H / 2, 0.0, H / 2, H])


def _numeric(f):
    return (f[4] - f[0]) / (2 * H)


@pytest.mark.parametrize("t0", [-0.9, -0.5, -0.1, 0.0, 0.3, 0.7, 0.95])
def test_a_slope_change_that_moves_the_difference_is_detected(t0):
    for slope in (1.0, 1e-2):  # the error is slope·(h − |t0|)/2h; tolerance 1e-5 + 1e-3·|n|
        f = 0.3 + 2.0 * TS + slope * np.maximum(0.0, TS - t0 * H)
        error = slope * (1 - abs(t0)) / 2
        tol = 1e-5 + 1e-3 * abs(_numeric(f))
        if error > tol / 2:
            assert nondifferentiable(F64, TS, f[:, None], _numeric(f), H, vector=False), (t0, slope)


def test_smooth_functions_are_not_kinks_even_after_float32_rounding():
    x0 = np.linspace(-3, 3, 41)
    # 100 + sin: float32 rounding of the large value (ulp 7.6e-6) is far above KAPPA·h·tol
    for fn in (np.sin, np.exp, np.tanh, lambda v: v ** 3, lambda v: 100 + np.sin(v)):
        f = fn(x0[None, :] + TS[:, None] * 1e3)  # h = 1e-3, the float32 step
        for dtype, test in ((np.float64, KinkTest(1e-5, 1e-3, np.dtype(np.float64))),
                            (np.float32, KinkTest(1e-3, 1e-2, np.dtype(np.float32)))):
            v = f.astype(dtype).astype(np.float64)
            n = (v[4] - v[0]) / 2e-3
            assert not nondifferentiable(test, TS * 1e3, v, n, 1e-3, vector=True)
            assert not nondifferentiable(test, TS * 1e3, v, n.sum(), 1e-3, vector=False)


def test_jumps_and_changes_of_finiteness_are_kinks():
    jump = (TS > 0.4 * H).astype(float)
    assert nondifferentiable(F64, TS, jump[:, None], _numeric(jump), H, vector=False)
    with np.errstate(invalid="ignore"):
        log = np.log(TS + 0.3 * H)  # nan at the two left points
    assert nondifferentiable(F64, TS, log[:, None], 0.0, H, vector=False)
    const = np.ones((5, 3))
    assert not nondifferentiable(F64, TS, const, np.zeros(3), H, vector=True)


def _x(cli, *args):
    r = cli("gradcheck", "PlainReLU", "--eps", "0.05", "--resample", "0", "--json", *args)
    return r.code, json.loads(r.out)["tensors"][0] if r.out.strip() else r.err


@pytest.mark.parametrize("mode", ["exhaustive", "jacobian", "fast"])
def test_an_unsigned_kink_fails_without_detection_and_is_skipped_with_it(cli, tmp_path, mode):
    plugin = write(tmp_path / "plain.py", PLAIN_RELU)
    code, x = _x(cli, "--plugin", plugin, "--mode", mode)
    assert code == 1 and x["status"] == "FAIL", x
    code, x = _x(cli, "--plugin", plugin, "--mode", mode, "--detect-kinks")
    assert code == 0 and x["status"] == "PASS", x
    if mode != "fast":  # fast mode redraws a direction that crosses a kink instead of skipping it
        assert x["skipped"] > 0


def test_the_whole_model_check_detects_kinks_in_the_loss(cli, tmp_path):
    write(tmp_path / "plain.py", PLAIN_RELU)
    config = write(tmp_path / "c.yaml", "seed: 0\nplugins: [plain.py]\n"
                   "data: {type: spiral, classes: 3, points_per_class: 20}\n"
                   "model: [{type: Linear, units: 8}, PlainReLU, {type: Linear, units: 3}]\n"
                   "loss: SoftmaxCrossEntropy\noptimizer: SGD\ntrain: {epochs: 1}\n")
    args = ("gradcheck", config, "--eps", "0.2", "--resample", "0", "--json")
    plain = json.loads(cli(*args).out)
    detect = json.loads(cli(*args, "--detect-kinks").out)
    assert plain["result"] == "FAIL" and "0.weight" in plain["failed"]
    assert detect["result"] == "PASS" and detect["settings"]["detect_kinks"] is True
    assert sum(t["skipped"] for t in detect["tensors"]) > 0


@pytest.mark.slow
def test_no_builtin_layer_has_a_false_kink():
    reports = check_all(Settings(detect_kinks=True))
    assert [r.layer for r in reports if r.verdict != "PASS"] == []
    # built-ins with a kink declare a signature, so detection finds nothing more to skip
    assert {r.layer: sum(t.skipped for t in r.tensors) for r in reports if any(t.skipped for t in r.tensors)} == {}


# --- declared distances: redrawing points away from kinks (--kink-margin) -------------------------
DISTANCED_RELU = PLAIN_RELU.replace("PlainReLU", "DistancedReLU") + '''
    def kink_distance(self, x, y=None):
        return abs(x)
'''


def _margin_run(cli, plugin, *args):
    r = cli("gradcheck", "DistancedReLU", "--plugin", plugin, "--eps", "0.05", "--json", *args)
    return r.code, json.loads(r.out)


@pytest.mark.parametrize("mode", ["exhaustive", "fast"])
def test_a_declared_kink_distance_redraws_points_near_the_kink(cli, tmp_path, mode):
    plugin = write(tmp_path / "distanced.py", DISTANCED_RELU)
    # margin 0 redraws only exact zeros: the same failure as the layer without the hook
    code, off = _margin_run(cli, plugin, "--mode", mode, "--kink-margin", "0")
    assert code == 1 and off["tensors"][0]["status"] == "FAIL", off
    assert off["kinks"]["redrawn"] == 0 and off["settings"]["kink_margin"] == 0
    # a margin above the step: no element within reach of the kink is ever checked
    code, on = _margin_run(cli, plugin, "--mode", mode, "--kink-margin", "0.06")
    assert code == 0 and on["result"] == "PASS", on
    assert on["kinks"]["redrawn"] > 0 and on["kinks"]["near"] == 0
    assert on["tensors"][0]["skipped"] == 0 and on["settings"]["kink_margin"] == 0.06


def test_the_default_margin_is_ten_steps_and_is_reported(cli, tmp_path):
    plugin = write(tmp_path / "distanced.py", DISTANCED_RELU)
    assert Settings().resolved().kink_margin == 1e-5
    assert Settings(dtype="float32").resolved().kink_margin == 1e-5  # its float64 copy's step
    assert Settings(dtype="float32").resolved().float32_kink_margin == 1e-2  # where it must be float32's
    # with eps 0.05 the default margin 0.5 cannot be met by 21 N(0,1) inputs: after --resample
    # redraws the point is checked anyway, said so, and fails on the kink as it would without
    r = cli("gradcheck", "DistancedReLU", "--plugin", plugin, "--eps", "0.05", "--resample", "3")
    assert r.code == 1
    assert "point draw(s) within --kink-margin 5.0e-01 of a kink were redrawn" in r.out
    assert "still within it after --resample redraws were checked" in r.out


def test_a_negative_kink_margin_is_a_usage_error(cli):
    r = cli("gradcheck", "ReLU", "--kink-margin", "-1")
    assert r.code == 2 and "--kink-margin must be a non-negative number, got -1.0" in r.err


@pytest.mark.parametrize("name, dims", [("Hinge", "N=3,C=3"), ("L1", "C=3,D=2")])
def test_losses_and_penalties_with_kinks_redraw_too(cli, name, dims):
    def run(margin):
        r = cli("gradcheck", name, "--eps", "0.2", "--kink-margin", margin, "--dims", dims, "--json")
        return r.code, json.loads(r.out)

    code, off = run("0")
    assert code == 1, off  # a step of 0.2 straddles some kink of the N(0,1) draws
    code, on = run("0.24")
    assert code == 0 and on["kinks"]["redrawn"] > 0 and on["kinks"]["near"] == 0, on


def _built(spec: dict, shape: tuple):
    from dlrun import registry
    from dlrun.backend import CPU

    layer = registry.layers.build(spec, "t")
    layer.setup(CPU, np.float64, np.random.default_rng(0), CPU.rng(0))
    layer.build(shape)
    layer.training = True
    return layer


def test_builtin_kink_distances_match_brute_force():
    rng = np.random.default_rng(3)
    root2 = np.sqrt(2)
    # max-pooling with overlapping, padded windows: the gap between each window's top two values
    pool = _built({"type": "MaxPool2D", "pool_size": 3, "stride": 2, "padding": 1}, (2, 5, 6))
    x = rng.standard_normal((3, 2, 5, 6))
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.empty((3, 2, 3, 3))
    for a in range(3):
        for b in range(3):
            top = np.sort(xp[:, :, 2 * a:2 * a + 3, 2 * b:2 * b + 3].reshape(3, 2, -1), axis=-1)
            want[:, :, a, b] = (top[..., -1] - top[..., -2]) / root2
    np.testing.assert_allclose(pool.kink_distance(x), want, rtol=1e-15)
    assert _built({"type": "MaxPool2D", "pool_size": 1}, (2, 5, 6)).kink_distance(x) is None
    # min-max normalisation: the closer of the top two and the bottom two values of the batch
    s = np.sort(x.ravel())
    mm = _built({"type": "MinMaxNormalization"}, (2, 5, 6))
    np.testing.assert_allclose(mm.kink_distance(x), min(s[-1] - s[-2], s[1] - s[0]) / root2, rtol=1e-15)
    # LargeMarginFC: |f_i| over the norm of (x_i, w_{y_i}); no kink in evaluation
    fc = _built({"type": "LargeMarginFC", "units": 4}, (5,))
    x2, y = rng.standard_normal((6, 5)), np.array([0, 1, 2, 3, 3, 1])
    w = fc.weight.data
    want = [abs(x2[i] @ w[y[i]]) / np.sqrt(x2[i] @ x2[i] + w[y[i]] @ w[y[i]]) for i in range(6)]
    np.testing.assert_allclose(fc.kink_distance(x2, y), want, rtol=1e-14)
    fc.training = False
    assert fc.kink_distance(x2, y) is None
    # ReLU and L1: |x|; Hinge: |z_ij − z_iy + margin| / √2 off the label
    np.testing.assert_array_equal(_built({"type": "ReLU"}, (5,)).kink_distance(x2), abs(x2))
    from dlrun import registry

    np.testing.assert_array_equal(registry.regularizers.build({"type": "L1"}, "t").kink_distance(x2), abs(x2))
    hinge = registry.losses.build({"type": "Hinge", "margin": 0.5}, "t")
    z = rng.standard_normal((6, 4))
    got = hinge.kink_distance(z, y)
    for i in range(6):
        for j in range(4):
            assert got[i, j] == (np.inf if j == y[i] else abs(z[i, j] - z[i, y[i]] + 0.5) / root2)
