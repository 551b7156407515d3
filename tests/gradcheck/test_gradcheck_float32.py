"""float32 checks: float32 backward against central differences of a float64 copy (gradcheck.twin)."""
from __future__ import annotations

import json
from unittest import mock

import numpy as np
import pytest
from broken_layers import BUGS
from conftest import write
from test_gradcheck_broken import registered

from dlrun import registry
from dlrun.gradcheck import FAIL, PASS, Settings, check_layer, kinks, twin
from dlrun.gradcheck.losscheck import check_loss
from dlrun.layers import Layer
from dlrun.layers.batchnorm import BatchNorm

F32 = Settings(dtype="float32")


def no_twin():
    """The checker as it was: float32 layers differenced in float32."""
    return mock.patch.object(twin, "float64_side", lambda *a: "disabled for the test")


@pytest.mark.parametrize("name", ["BatchNorm", "Conv2D", "LayerNorm", "MaxPool2D", "Dropout"])
def test_correct_layers_pass_in_float32_with_float64_precise_differences(name):
    # BatchNorm and Conv2D failed here on rounding alone (sym rel ~1e-4, worst gaps over atol)
    phase = "both" if registry.layers.get(name).has_phase else "auto"
    report = check_layer(name, settings=Settings(dtype="float32", phase=phase))
    assert report.verdict == PASS, (report.failed, report.warnings)
    assert all(t.dtype == "float32" for t in report.tensors)  # the checked tensors', not the copy's
    assert max(t.sym_rel for t in report.tensors) < 1e-5, [(t.name, t.sym_rel) for t in report.tensors]
    assert not any("cannot stand in" in w for w in report.warnings), report.warnings  # Dropout: same mask


def test_float32_differences_failed_batchnorm_and_conv2d():
    # what the twin fixes, so that this file fails if it stops being used
    with no_twin():
        assert check_layer("BatchNorm", settings=F32).verdict == FAIL
        assert check_layer("Conv2D", settings=F32).verdict == FAIL


@pytest.mark.parametrize("cls", [c for c in BUGS if c.__name__ != "Float32Scratch"], ids=lambda c: c.__name__)
def test_every_planted_bug_still_fails_in_float32(cls):
    # (Float32Scratch is a float64-only bug: a float32 scratch array is right in a float32 layer)
    must_fail, _ = BUGS[cls]
    with registered(cls) as name:
        report = check_layer(name, settings=F32)
    failed = {t.name for t in report.tensors if t.status == FAIL} | {a.name for a in report.aux if a.status == FAIL}
    assert report.verdict == FAIL and must_fail & failed, (report.error, failed)


def test_a_small_scale_bug_that_float32_differences_passed_now_fails():
    # gradients under atol: only the relative rule sees the factor 2, and it needs differences
    # whose rounding is known to be tiny (float64's)
    cls = next(c for c in BUGS if c.__name__ == "SmallScaleBug")
    with registered(cls) as name:
        with no_twin():
            assert check_layer(name, settings=F32).verdict == PASS
        report = check_layer(name, settings=F32)
    assert report.verdict == FAIL and report.tensors[0].status == FAIL
    assert any("disagree by sym rel" in n for n in report.tensors[0].notes)


def test_jacobian_mode_uses_the_twin_too():
    report = check_layer("BatchNorm", settings=Settings(dtype="float32", mode="jacobian", dims="N=4,D=3"))
    assert report.verdict == PASS and max(t.sym_rel for t in report.tensors) < 1e-5
    cls = next(c for c in BUGS if c.__name__ == "MissingFactor")
    with registered(cls) as name:
        assert check_layer(name, settings=Settings(dtype="float32", mode="jacobian")).verdict == FAIL


class Float32OnlyBatchNorm(BatchNorm):
    """BatchNorm that refuses to be built in any dtype but float32 (so no float64 copy exists)."""

    def build(self, input_shape):
        if self.dtype != np.float32:
            raise TypeError("float32 only")
        return super().build(input_shape)


def test_without_a_float64_copy_the_differences_are_float32_and_rounding_is_explained():
    with registered(Float32OnlyBatchNorm) as name:
        report = check_layer(name, settings=F32)
    fell_back = [w for w in report.warnings if "a float64 copy cannot stand in" in w]
    assert len(fell_back) == 1 and "float32 only" in fell_back[0], report.warnings  # once, with the reason
    assert "with step 0.001" in fell_back[0]  # float32's step, not the float64 copy's 1e-6
    x = next(t for t in report.tensors if t.name == "x")
    assert x.status == FAIL and any("float32 rounding" in n for n in x.notes)  # the old verdict, explained


class DtypeMask(BatchNorm):
    """A layer whose output depends on the dtype itself (a float64 instance doubles it)."""

    def forward(self, x):
        out = super().forward(x)
        return out * 2 if out.dtype == np.float64 else out


def test_a_copy_whose_output_differs_is_not_used():
    with registered(DtypeMask) as name:
        report = check_layer(name, settings=F32)
    assert any("its float64 output differs from the float32 one" in w for w in report.warnings), report.warnings


class Float32Inside(Layer):
    """y = tanh(x) ⊙ w, computed in float32 whatever the input's dtype (a correct backward)."""

    def build(self, shape):
        self.w = self.add_param("w", shape, "normal")
        return shape

    def forward(self, x, y=None):
        self._t = np.tanh(x.astype(np.float32))
        return (self._t * self.w.data.astype(np.float32)).astype(x.dtype)

    def backward(self, dy):
        t = self._t
        self.w.grad[...] = (dy * t).sum(axis=0)
        return (dy * (1 - t * t) * self.w.data.astype(np.float32)).astype(dy.dtype)


def test_a_layer_that_computes_in_float32_whatever_it_is_given_falls_back_and_passes():
    """Its float64 copy's output equals the float32 one, so the copy was taken as a stand-in and
    differenced with float64's step 1e-6 on a float32-rounded function: a correct layer FAILed
    (analytic 0.8247, numeric 0.7161)."""
    with registered(Float32Inside) as name:
        report = check_layer(name, settings=F32)
    assert report.verdict == PASS, [(t.name, t.worst) for t in report.tensors]
    assert any("it computes in float32 whatever it is given" in w for w in report.warnings), report.warnings


@pytest.mark.parametrize("name", ["SoftmaxCrossEntropy", "MSE", "Huber", "BinaryCrossEntropy"])
def test_losses_in_float32_are_differenced_in_float64(name):
    report = check_loss(name, settings=F32)
    assert report.verdict == PASS and report.tensors[0].dtype == "float32"
    assert report.tensors[0].sym_rel < 1e-5  # float32 differences: 1.6e-4 to 4.6e-4


LOSS_FLOAT32_ONLY = '''
import numpy as np
from dlrun.losses.regression import MSE
from dlrun.registry import losses


@losses.register()
class MSE32(MSE):
    """MSE that refuses float64 scores."""

    def forward(self, z, y):
        if z.dtype == np.float64:
            raise TypeError("float32 scores only")
        return super().forward(z, y)
'''


def test_a_loss_without_a_float64_copy_is_differenced_in_float32_with_a_note(cli, tmp_path):
    plugin = write(tmp_path / "mse32.py", LOSS_FLOAT32_ONLY)
    r = cli("gradcheck", "MSE32", "--plugin", plugin, "--dtype", "float32", "--json")
    z = json.loads(r.out)["tensors"][0]
    assert r.code == 0 and z["status"] == PASS, r.out + r.err
    assert any("differences taken in float32 with step 0.001" in n and "float32 scores only" in n
               for n in z["notes"]), z


@pytest.mark.slow
def test_whole_model_in_float32_is_differenced_in_float64(cli):
    r = cli("gradcheck", "configs/moons_dropout.yaml", "--dtype", "float32", "--json")
    report = json.loads(r.out)
    assert r.code == 0, r.out + r.err
    assert not any("cannot stand in" in w for w in report["warnings"])  # Dropout's mask: the same in both
    assert max(t["sym_rel"] for t in report["tensors"]) < 1e-5  # float32 differences: up to 3.3e-4
    # the text report says the float32 warning once, not once more for every layer checked on its own
    r = cli("gradcheck", "configs/moons_dropout.yaml", "--dtype", "float32")
    assert r.code == 0, r.out + r.err
    assert r.err.count("warning: float32 check:") == 1, r.err
    assert len(report["children"]) > 1 and all(any(w.startswith("float32 check:") for w in c["warnings"])
                                                 for c in report["children"])  # JSON keeps each report whole


def test_steps_follow_the_dtype_of_the_differences():
    s = F32.resolved()
    assert (s.eps, s.float32_eps, s.step("float64"), s.step("float32")) == (1e-6, 1e-3, 1e-6, 1e-3)
    assert (s.kink_margin, s.float32_kink_margin) == (1e-5, 1e-2)  # 10 steps of each
    s = Settings(dtype="float32", eps=1e-4).resolved()  # --eps sets both
    assert (s.step("float64"), s.step("float32"), s.kink_margin, s.float32_kink_margin) == (1e-4, 1e-4, 1e-3, 1e-3)
    s = Settings(dtype="float32", kink_margin=0.5).resolved()  # --kink-margin sets both
    assert (s.kink_margin, s.float32_kink_margin) == (0.5, 0.5)
    s = Settings().resolved()
    assert (s.eps, s.float32_eps, s.kink_margin) == (1e-6, 1e-6, 1e-5)


def test_the_kink_margin_widens_only_for_points_differenced_in_float32():
    d = kinks.Dodge(1e-5, 1e-2)
    assert not d.redraw(3e-3, final=False)  # beyond the float64 copy's margin
    assert d.recheck(3e-3, final=False) and d.redrawn == 1  # ... but it fell back: within float32's
    assert not d.recheck(3e-6, final=False) and d.redrawn == 1  # (redraw judged that one already)
    assert d.redraw(3e-3, final=False, fallback=True) and d.redrawn == 2 and d.widened
    assert not d.redraw(3e-3, final=True, fallback=True) and d.near == 1
    assert not kinks.Dodge(1e-5).recheck(3e-3, final=False)  # a float64 check never falls back


def test_float32_checks_redraw_only_for_the_float64_copys_step_unless_they_fall_back(monkeypatch):
    # the float64 copy's 1e-6 steps need a 1e-5 margin: MaxPool2D redrew 51 points for 1e-2
    report = check_layer("MaxPool2D", settings=F32)
    assert report.verdict == PASS and report.kinks["redrawn"] == 0, report.kinks
    assert report.settings["kink_margin"] == 1e-5 and "float32_margin" not in report.kinks
    rechecked = []
    recheck = kinks.Dodge.recheck
    monkeypatch.setattr(kinks.Dodge, "recheck", lambda self, *a: rechecked.append(a) or recheck(self, *a))
    with no_twin():  # differenced in float32 with step 1e-3: held to 1e-2
        report = check_layer("MaxPool2D", settings=F32)
    assert report.verdict == PASS and report.kinks["redrawn"] > 0, report.kinks
    assert report.kinks["float32_margin"] == report.settings["float32_kink_margin"] == 1e-2
    # the first point of each shape configuration (a new instance), before its fallback was known;
    # later points are held to the wider margin when drawn
    assert len(rechecked) == 2


@pytest.mark.slow
def test_float32_model_check_compares_a_conv_bias_that_float32_steps_skipped(cli):
    # every ReLU/max-pool position a conv bias feeds moves by the step: with float32's 1e-3 some
    # element of 0.bias crossed a kink at every redraw and the bias was reported "not compared"
    r = cli("gradcheck", "configs/digits_cnn.yaml", "--dtype", "float32", "--json")
    report = json.loads(r.out)
    assert r.code == 0 and report["result"] == PASS, r.out + r.err
    bias = next(t for t in report["tensors"] if t["name"] == "0.bias")
    assert bias["checked"] == 32 and bias["skipped"] == 0, bias
    assert report["settings"]["eps"] == 1e-6
