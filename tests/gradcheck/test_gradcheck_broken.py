"""gradcheck must FAIL each planted bug, naming the right tensor, and PASS correct kinked layers."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from broken_layers import BUGS, CORRECT
from dlrun import registry
from dlrun.gradcheck import FAIL, PASS, Settings, check_layer
from dlrun.layers.base import Layer


@contextlib.contextmanager
def registered(cls):
    name = f"Broken{cls.__name__}"
    registry.layers.register(name)(cls)
    try:
        yield name
    finally:
        registry.layers.unregister(name)


@pytest.mark.parametrize("cls", list(BUGS), ids=lambda c: c.__name__)
def test_planted_bug_fails_and_names_the_tensor(cls):
    must_fail, must_pass = BUGS[cls]
    with registered(cls) as name:
        report = check_layer(name)
    failed = {t.name for t in report.tensors if t.status == FAIL} | {a.name for a in report.aux if a.status == FAIL}
    assert report.verdict == FAIL, (report.error, failed)
    assert must_fail <= failed, f"expected {must_fail} among failures, got {failed}"
    assert not (must_pass & failed), f"{must_pass & failed} wrongly blamed"


def test_transposed_grad_is_a_message_not_a_crash():
    from broken_layers import TransposedWeightGrad

    with registered(TransposedWeightGrad) as name:
        report = check_layer(name)
    weight = next(t for t in report.tensors if t.name == "weight")
    assert any("grad shape (3, 4) != param shape (4, 3)" in n for n in weight.notes), weight.notes
    assert report.error is None


def test_seed_wrong_axis_also_reports_the_index_error_when_d_exceeds_n():
    from broken_layers import SeedWrongAxis

    with registered(SeedWrongAxis) as name:
        report = check_layer(name)
    assert report.error and report.error.startswith("backward raised IndexError"), report.error
    assert "N=3 D=5" in report.error


@pytest.mark.parametrize("name", ["ReLU", "LargeMarginFC", "ReQU", "MinMaxNormalization", "LeakyReLU",
                                  "NormalizedDense"])
def test_correct_kinked_layers_pass_over_many_seeds(name):
    for seed in range(60):
        report = check_layer(name, settings=Settings(seed=seed))
        assert report.verdict == PASS, (seed, [(t.name, t.worst) for t in report.tensors], report.aux)


def test_kink_crossing_elements_are_skipped_not_compared():
    """A ReLU input placed within h of 0 crosses the kink; it must be skipped, not failed."""
    from dlrun.gradcheck.numeric import Probe, TensorRun, check_elements

    x = np.array([[0.3e-6, -1.0, 2.0]])
    g = np.array([[1.0, 1.0, 1.0]])
    loss = lambda: float((g * np.maximum(x, 0)).sum())  # noqa: E731
    sig = lambda: x > 0  # noqa: E731
    probe = Probe(loss, 1e-6, sig, sig())
    run = TensorRun("x", "input", x.shape, "float64", "exhaustive")
    check_elements(probe, x, g * (x > 0), np.arange(3), run, 1e-6, 1e-5, 1e-3, "test")
    assert (run.skipped, run.checked, run.failed) == (1, 2, False)


def test_perturbation_restores_the_saved_value_exactly():
    from dlrun.gradcheck.numeric import Probe, element_derivative

    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        a = rng.standard_normal((5, 4)).astype(dtype)
        before = a.copy()
        for i in range(a.size):
            d, _ = element_derivative(Probe(lambda: float((a.astype(np.float64) ** 2).sum()), 1e-3), a,
                                      np.unravel_index(i, a.shape), 1e-3)
            assert abs(d - 2 * float(before.flat[i])) < 1e-2
        assert a.tobytes() == before.tobytes()


def test_relative_errors_symmetric_error_and_band():
    from dlrun.gradcheck.numeric import sym_rel
    from dlrun.gradcheck.report import band

    a, n = np.array([1.0, -2.0, 0.0]), np.array([1.0, -2.0, 0.0])
    assert sym_rel(a, n) == 0.0 and sym_rel(np.zeros(3), np.zeros(3)) == 0.0
    assert sym_rel(np.array([3.0, 4.0]), np.array([3.0, 0.0])) == pytest.approx(4 / np.sqrt(36 + 16))
    assert sym_rel(np.array([1.0]), np.array([-1.0])) > 1e200  # opposite: huge, but finite (JSON)
    assert [band(v) for v in (0.0, 9.9e-8, 1e-7, 5e-5, 1e-4, 5e-3, 1e-2, 0.7)] == [
        "happy", "happy", "ok with kinks", "ok with kinks", "uneasy", "uneasy", "wrong", "wrong"]


def test_a_report_carries_the_symmetric_error_and_band():
    from broken_layers import MissingFactor

    good = check_layer("ReQU").to_dict()["tensors"][0]
    assert good["band"] == "happy" and 0 < good["sym_rel"] < 1e-8, good
    # LayerNorm's spec never normalises a 2-element axis, where the output is ±1 whatever x is and
    # the x gradient nearly 0: checked there, sym rel was 2e-7 (all rounding)
    assert {t.band for t in check_layer("LayerNorm").tensors} == {"happy"}
    with registered(MissingFactor) as name:
        bad = check_layer(name).to_dict()["tensors"][0]
    # backward gives half the derivative: (a − n)/(a + n) = (−n/2)/(3n/2) everywhere
    assert bad["band"] == "wrong" and bad["sym_rel"] == pytest.approx(1 / 3, rel=1e-6), bad


TINY_OUTPUT = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class Tiny(Layer):
    """y = 1e-12·x, whose backward forgot the factor."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        return 1e-12 * x

    def backward(self, dy):
        return dy
'''


def test_a_numeric_gradient_below_floating_point_range_is_named(cli, tmp_path):
    from conftest import write

    plugin = write(tmp_path / "tiny.py", TINY_OUTPUT)
    r = cli("gradcheck", "Tiny", "--plugin", plugin, "--json")
    x = __import__("json").loads(r.out)["tensors"][0]
    assert r.code == 1 and x["status"] == "FAIL"
    assert any("numeric gradient is below 1e-10 everywhere but backward's is not" in n for n in x["notes"]), x


def test_a_failed_direction_is_located_by_checking_elements():
    from broken_layers import MissingFactor

    with registered(MissingFactor) as name:
        x = check_layer(name, settings=Settings(mode="fast")).tensors[0]
    assert x.status == FAIL and x.mode == "fast+sampled", x
    # the element found is one where backward gives half the finite difference
    assert x.worst is not None and x.worst.analytic == pytest.approx(x.worst.numeric / 2, rel=1e-5)
    assert x.notes[0].startswith("to locate the failure,") and "the worst is shown" in x.notes[0]
    # a passing tensor is not sampled
    assert check_layer("ReQU", settings=Settings(mode="fast")).tensors[0].mode == "fast"


NOISY = '''
import numpy as np
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers

_RNG = np.random.default_rng()


@layers.register()
class NoisyScale(Layer):
    """y = x·m with m drawn from a module-level generator, not from self.rng."""

    input_spec = InputSpec(shape=("D",))
    stochastic = STOCHASTIC

    def forward(self, x):
        self._m = (self.rng if USE_OWN else _RNG).uniform(0.5, 1.5, x.shape).astype(x.dtype)
        return x * self._m

    def backward(self, dy):
        return dy * self._m
'''


@pytest.mark.parametrize("stochastic, own, code", [(False, False, 2), (True, False, 2), (True, True, 0)])
def test_a_forward_that_is_not_repeatable_is_refused(cli, tmp_path, stochastic, own, code):
    from conftest import write

    plugin = write(tmp_path / "noisy.py", NOISY.replace("STOCHASTIC", str(stochastic)).replace("USE_OWN", str(own)))
    r = cli("gradcheck", "NoisyScale", "--plugin", plugin)
    assert r.code == code, r.out + r.err
    if code == 2:  # random numbers not drawn from the reseeded self.rng
        assert "two forwards at the same point give different outputs" in r.out
        assert "stochastic without the seed hook" in r.out and "self.rng" in r.out
    else:
        assert "RESULT NoisyScale: PASS" in r.out


NOT_AN_ARRAY = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class ListOut(Layer):
    """y = x, returned as a list of rows."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        return list(x)

    def backward(self, dy):
        return dy
'''


def test_bad_returns_and_bad_settings_are_one_line_errors_not_crashes(cli, tmp_path):
    from conftest import write

    plugin = write(tmp_path / "listout.py", NOT_AN_ARRAY)
    r = cli("gradcheck", "ListOut", "--plugin", plugin)
    assert r.code == 2 and "forward returned list, expected an array of shape (7, 3)" in r.out, r.out + r.err
    assert "internal error" not in r.out + r.err
    for args, text in ((["--eps", "1e-17"], "θ ± eps rounds back to θ"),
                       (["--eps", "1e-17", "--mode", "fast"], "θ ± eps rounds back to θ"),
                       (["--seed", "-1"], "--seed must be at least 0, got -1"),
                       # (a negative --max-exhaustive ran as 0; a repeated dim kept its last value)
                       (["--max-exhaustive", "-5"], "--max-exhaustive must be at least 0, got -5"),
                       (["--dims", "N=3,N=4"], "--dims: N is given twice")):
        r = cli("gradcheck", "Linear", *args)
        assert r.code == 2 and text in r.err and "Traceback" not in r.err, (args, r.out, r.err)


def test_nan_fails_the_tensor_and_json_stays_valid(cli, tmp_path):
    import json

    from broken_layers import NaNBackward, NaNForward

    with registered(NaNForward) as name:
        report = check_layer(name)
    x = report.tensors[0]
    assert x.status == FAIL and x.band == "wrong" and any("forward's output is not finite" in n for n in x.notes)
    with registered(NaNBackward) as name:
        report = check_layer(name)
    x = next(t for t in report.tensors if t.name == "x")
    assert x.status == FAIL and np.isnan(x.worst.analytic) and any("backward's gradient for x" in n for n in x.notes)
    d = json.loads(report.to_json())  # strict JSON: NaN and inf written as null
    assert d["result"] == FAIL and d["tensors"][0]["worst"]["analytic"] is None and d["tensors"][0]["max_abs"] is None


def test_one_wrong_element_in_a_large_tensor_fails_by_the_relative_rule():
    from broken_layers import OneElementBug

    with registered(OneElementBug) as name:
        report = check_layer(name, settings=Settings(dims="N=100,D=60"))
    x = next(t for t in report.tensors if t.name == "x")
    assert x.mode == "fast+sampled" and x.status == FAIL, x
    assert any("disagree by sym rel" in n for n in x.notes), x.notes
    assert "second-point" not in report.failed  # sampling luck at one point is not a stale cache
    assert check_layer("Linear", settings=Settings(dims="N=100,D=60")).verdict == PASS


BIG_OUTPUT = '''
import numpy as np
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class BigCube(Layer):
    """y[:, j] = scale·Σ_i x_i³ for 50 outputs j: a correct layer with large outputs."""

    input_spec = InputSpec(shape=("D",))

    def __init__(self, scale: float = 1e6):
        self.scale = scale

    def build(self, shape):
        return (50,)

    def forward(self, x):
        self._x = x
        return self.scale * np.repeat((x ** 3).sum(1, keepdims=True), 50, axis=1)

    def backward(self, dy):
        return self.scale * dy.sum(1, keepdims=True) * 3 * self._x ** 2
'''


def test_strict_allows_float64_rounding_of_large_outputs(cli, tmp_path):
    from conftest import write

    plugin = write(tmp_path / "big.py", BIG_OUTPUT)
    for scale in ("1", "1e3", "1e8"):  # 1e3 and up failed --strict on rounding of L alone
        r = cli("gradcheck", "BigCube", "--plugin", plugin, "--strict", "--set", f"scale={scale}")
        assert r.code == 0, (scale, r.out)


NEON_STYLE = '''
import numpy as np
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class PlainStats(Layer):
    """Batch normalisation whose running statistics are plain attributes (not in `state`)."""

    has_phase = True
    input_spec = InputSpec(shape=("D",))

    def build(self, s):
        self.gmean = np.zeros(s, self.dtype)
        return s

    def forward(self, x):
        mu = x.mean(0) if self.training else self.gmean
        if self.training:
            self.gmean = 0.9 * self.gmean + 0.1 * mu
        self._n = len(x) if self.training else None
        return x - mu

    def backward(self, dy):
        return dy - dy.mean(0) if self._n else dy


@layers.register()
class PlainWeight(Layer):
    """y = x Wᵀ with W a plain attribute (neon's ParameterLayer style): never trained."""

    input_spec = InputSpec(shape=("D",))

    def build(self, s):
        self.W = np.full((4, s[0]), 0.5, self.dtype)
        return (4,)

    def forward(self, x):
        return x @ self.W.T

    def backward(self, dy):
        return dy @ self.W


@layers.register()
class Promotes(Layer):
    """z = x² where x > 0, its backward promoting float32 to float64 (int array times float32)."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        self._x = x
        return x * x * (x > 0)

    def backward(self, dy):
        return 2 * (self._x > 0).astype(np.int64) * self._x * dy
'''


def test_what_training_would_lose_or_refuse_is_named_by_a_float64_check(cli, tmp_path):
    """Three layers whose float64 gradients are right and that passed, yet train wrongly: running
    statistics outside `state` (not checkpointed: the restored model predicted at chance), a weight
    outside the parameters (never trained), a backward that returns float64 in float32 training."""
    from conftest import write

    plugin = write(tmp_path / "neon.py", NEON_STYLE)
    r = cli("gradcheck", "PlainStats", "--plugin", plugin)
    assert r.code == 1 and "RESULT PlainStats: FAIL (state)" in r.out, r.out
    assert "gmean (an array of shape (3,): running statistics?) changed in one forward/backward but is not " \
           "declared in `state`" in r.out
    r = cli("gradcheck", "PlainWeight", "--plugin", plugin)
    assert r.code == 0, r.out  # a constant may stay an attribute: a warning, not a FAIL
    assert "PlainWeight keeps float arrays that are not parameters: W (4, 3)" in r.err
    assert r.err.count("keeps float arrays") == 1  # once, though two shape configurations are checked
    r = cli("gradcheck", "Promotes", "--plugin", plugin)
    assert r.code == 1 and "RESULT Promotes: FAIL (float32)" in r.out, r.out
    assert "with float32 inputs and parameters (training's default) it returns dx float64" in r.out
    r = cli("gradcheck", "Promotes", "--plugin", plugin, "--dtype", "float32")
    assert "x: not compared" in r.out and "x: happy" not in r.out  # no band for a tensor never compared


class _RebindingLinear:
    """y = x Wᵀ whose forward replaces W's array (W.data = prepare(W.data)), as training's arena
    allows: the check must perturb the array the layer reads next, not the one it replaced."""

    def __init__(self, units: int = 4):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.add_param("weight", (self.units, input_shape[-1]), "xavier_uniform")
        return (self.units,)

    def forward(self, x, y=None):
        w = self.params["weight"]
        w.data = self.prepare(w.data)
        self.x = x
        return x @ w.data.T

    def backward(self, dy):
        w = self.params["weight"]
        w.grad = dy.T @ self.x  # rebinding the gradient too
        return dy @ w.data


def _rebinding(prepare):
    from dlrun.layers import Layer

    return type("Rebinding", (_RebindingLinear, Layer), {"prepare": staticmethod(prepare)})


def test_a_layer_that_replaces_its_parameter_arrays_is_checked_on_the_arrays_it_reads():
    """W.data = W.data.copy() passed training (the arena copies a replaced array back) but FAILed
    gradcheck: the checker perturbed the old array, so the numeric gradient was 0. One that
    changes the values it reassigns (a clip in forward) is named as reassigning them."""
    with registered(_rebinding(lambda w: w.copy())) as name:
        report = check_layer(name)
    assert report.verdict == PASS, ([(t.name, t.worst) for t in report.tensors], report.aux)
    with registered(_rebinding(lambda w: np.clip(w, -0.1, 0.1))) as name:
        report = check_layer(name)
    unchanged = next(a for a in report.aux if a.name == "inputs-unchanged")
    assert unchanged.status == FAIL and "parameter weight (reassigned: weight.data = ...)" in unchanged.detail, unchanged


class TrainOnlyNoise(Layer):
    """y = x + σ·ε in training (ε ~ N(0, 1) from self.rng), y = x in evaluation: σ is unused in
    evaluation, with a zero gradient there, which is right."""

    has_phase = True
    stochastic = True

    def build(self, input_shape):
        self.sigma = self.add_param("sigma", (1,), "ones")
        return tuple(input_shape)

    def forward(self, x):
        self._eps = self.rng.standard_normal(x.shape).astype(x.dtype) if self.training else None
        return x + self.sigma.data * self._eps if self.training else x * 1.0

    def backward(self, dy):
        self.sigma.grad[...] = (dy * self._eps).sum() if self.training else 0.0
        return dy * 1.0


def test_a_parameter_used_in_training_only_is_not_unwired_in_evaluation():
    with registered(TrainOnlyNoise) as name:
        report = check_layer(name, settings=Settings(phase="both"))
    assert report.verdict == PASS, (report.error, report.failed)


@pytest.mark.parametrize("mode", ["auto", "jacobian"])
@pytest.mark.parametrize("cls", CORRECT, ids=lambda c: c.__name__)
def test_unusual_but_correct_layers_pass(cls, mode):
    """Also in --mode jacobian, whose one backward per output row had no forward before it."""
    with registered(cls) as name:
        report = check_layer(name, settings=Settings(mode=mode))
    assert report.verdict == PASS, (report.error, report.failed)


def test_state_check_ignores_rounding_of_a_recomputed_value_but_not_a_counter_or_annealing():
    from dlrun.gradcheck.auxiliary import scalar_changes

    # a batch mean recomputed with the rows reversed moved by one ulp (a monitoring attribute)
    assert scalar_changes({"last_mean": 0.0511057013332283}, {"last_mean": 0.05110570133322831}) == []
    assert scalar_changes({"steps": 10**15}, {"steps": 10**15 + 1}) != []  # integers compare exactly
    assert scalar_changes({"beta": 1.0}, {"beta": 0.999}) != []
    assert scalar_changes({"v": float("nan")}, {"v": float("nan")}) == []
    # in a float32 check the recomputed mean moves by float32 ulps; annealing by 0.999 still shows
    assert scalar_changes({"m": -0.108537957072258}, {"m": -0.1085379347205162}, "float32") == []
    assert scalar_changes({"beta": 1.0}, {"beta": 0.999}, "float32") != []
    assert scalar_changes({"z": 1j}, {"z": 2j}) != []


def test_a_layer_reading_self_training_without_has_phase_is_checked_in_both_phases_with_a_warning():
    from broken_layers import UndeclaredPhase

    with registered(UndeclaredPhase) as name:
        report = check_layer(name)
    assert report.settings["phase"] == "train+eval"
    assert any("differs between training and evaluation, but it does not set has_phase = True" in w
               for w in report.warnings), report.warnings


class LearnedThresholdReLU(Layer):
    """y = max(x − t, 0) with a learned threshold t (PACT-style): t moves every kink at once, so
    at a float32 step its own differences may all be skipped; the layer is right."""

    def build(self, input_shape):
        self.t = self.add_param("t", (1,), "zeros")
        return tuple(input_shape)

    def forward(self, x):
        self._m = x > self.t.data[0]
        return (x - self.t.data[0]) * self._m

    def backward(self, dy):
        g = dy * self._m
        self.t.grad[...] = -g.sum()
        return g

    def branch_signature(self):
        return self._m


class EvenBatchesOnly(Layer):
    """Adds each odd row's square to the even row before it: takes even batch sizes only (with
    train.drop_last); the fast-mode check's one-row-fewer call must not fail it."""

    def forward(self, x):
        if len(x) % 2:
            raise ValueError("EvenBatchesOnly needs an even batch size")
        self._x = x
        out = x.copy()
        out[0::2] = x[0::2] + x[1::2] ** 2
        return out

    def backward(self, dy):
        dx = dy.copy()
        dx[1::2] = dy[1::2] + 2 * self._x[1::2] * dy[0::2]
        return dx


@pytest.mark.parametrize("cls,settings", [
    (LearnedThresholdReLU, Settings(dtype="float32", dims="N=200,D=50")),
    (EvenBatchesOnly, Settings(dims="N=8,D=3")),
], ids=["learned-threshold", "even-batches"])
def test_correct_layers_the_new_aux_checks_failed(cls, settings):
    """kink-skips failed a tensor all of whose differences were skipped, and fast-mode a layer
    that refuses a batch size in plain mode too (review of this session's changes)."""
    with registered(cls) as name:
        report = check_layer(name, settings=settings)
    assert report.verdict == PASS, (report.error, report.failed, [(a.name, a.detail) for a in report.aux])


class OneNameTwoArrays(Layer):
    """y = 3x, plus 2x on the first half of the rows, with both scratch arrays asked for under one
    name: in fast mode the half-batch array is the leading rows of the whole one."""

    def forward(self, x):
        n = len(x)
        whole = np.multiply(x, 3.0, out=self.output_array("tmp", x.shape, x.dtype))
        half = np.multiply(x[:n // 2], 2.0, out=self.output_array("tmp", (n // 2,) + x.shape[1:], x.dtype))
        out = whole.copy()
        out[:n // 2] += half
        return out

    def backward(self, dy):
        dx = dy * 3.0
        dx[:len(dy) // 2] += dy[:len(dy) // 2] * 2.0
        return dx


def test_a_buffer_name_shared_by_two_arrays_alive_at_once_fails_fast_mode_and_says_so():
    with registered(OneNameTwoArrays) as name:
        report = check_layer(name)
    fast = {a.name: a for a in report.aux}["fast-mode"]
    assert report.verdict == FAIL and fast.status == FAIL, (report.verdict, fast)
    assert "one buffer name serves two arrays alive at once" in fast.detail
