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
