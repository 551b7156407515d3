"""gradcheck names a root cause without blaming its consequences on other causes; a gradient
written with the wrong shape is a FAIL; a layer computing in float32 is pointed at --dtype float32;
the report shows the options each check built the layer with."""
from __future__ import annotations

import json

import pytest
from broken_layers import AccumulatesInBuffer, AnnealsInBackward, AssignsTransposedGrad, ComputesInFloat32, StaleMask
from conftest import write
from test_gradcheck_broken import registered

from dlrun.gradcheck import FAIL, PASS, Settings, check_layer
from dlrun.gradcheck.diagnose import Pattern
from dlrun.gradcheck.report import NA

HERE = __import__("pathlib").Path(__file__).resolve().parents[1]


def plugin(tmp_path, cls) -> str:
    """A --plugin file registering the fixture ``cls`` of broken_layers under its own name (the
    CLI loads components from files)."""
    return str(write(tmp_path / f"{cls.__name__.lower()}.py", f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from broken_layers import {cls.__name__}
from dlrun.registry import layers
layers.register("{cls.__name__}")({cls.__name__})
"""))


def _aux(report, name):
    return next(a for a in report.aux if a.name == name)


def _tensor(report, name):
    return next(t for t in report.tensors if t.name == name)


@pytest.mark.parametrize("cls, roots", [(AccumulatesInBuffer, "aux reentrant"),
                                        (AnnealsInBackward, "aux reentrant and aux state")])
def test_a_layer_that_does_not_repeat_itself_is_blamed_once(cls, roots):
    """A buffer that accumulates, a coefficient annealed in backward: the checks that compare two
    calls failed too, each with a cause of its own (a reused buffer, a copy through ravel, backward
    not multiplied by the upstream gradient), and the tensors got a '2 ×' factor hint."""
    with registered(cls) as name:
        report = check_layer(name)
    assert report.verdict == FAIL
    for check in ("zero-upstream", "fast-mode", "non-contiguous"):
        a = _aux(report, check)
        assert a.status in (PASS, NA), (check, a)
        if a.status == NA:
            assert a.detail.startswith(f"not judged: follows from {roots}"), a.detail
    failed = [t for t in report.tensors if t.status == FAIL]
    assert failed
    for t in failed:
        assert not any(isinstance(n, Pattern) or "×" in n for n in t.notes), t.notes
        assert any(f"not diagnosed further: the layer does not give the same result twice at one point ({roots})"
                   in n for n in t.notes), t.notes
    assert set(report.failed) <= {"x", "weight", "bias", "reentrant", "state"}, report.failed


def test_the_accumulating_buffer_fails_what_it_broke_and_only_that(cli, tmp_path):
    with registered(AccumulatesInBuffer) as name:
        report = check_layer(name)
    assert {a.name for a in report.aux if a.status == NA and a.detail} == {"zero-upstream", "fast-mode",
                                                                           "non-contiguous"}
    r = cli("gradcheck", "AccumulatesInBuffer", "--plugin", plugin(tmp_path, AccumulatesInBuffer))
    assert r.code == 1 and "RESULT AccumulatesInBuffer: FAIL (weight, reentrant)" in r.out, r.out
    assert "aux fast-mode         n/a  not judged: follows from aux reentrant" in r.out, r.out
    assert "a constant factor" not in r.out and "writes through a copy" not in r.out


def test_a_stale_mask_with_a_signature_is_stale_state_and_its_point_is_compared(cli, tmp_path):
    """The mask backward reads (and branch_signature returns) came from an earlier input: every
    difference at the second point was skipped as a kink crossing, redrawn 20 times, and kink-skips
    blamed the signature's design or --eps; the JSON said 0 redraws."""
    with registered(StaleMask) as name:
        report = check_layer(name)
    r = cli("gradcheck", "StaleMask", "--plugin", plugin(tmp_path, StaleMask), "--json")
    state = _aux(report, "state")
    assert state.status == FAIL and "branch_signature() differs between two forwards at the same point" in state.detail
    assert "stale cache" in state.detail
    x = _tensor(report, "x")
    assert x.status == FAIL and x.skipped == 0 and x.checked > 0, x  # compared, not skipped away
    assert _aux(report, "kink-skips").status != FAIL
    d = json.loads(r.out)
    assert d["kinks"]["redrawn"] == d["kinks"]["crossed"] == 0 and "redraw(s)" not in r.out


def test_redraws_for_crossed_kinks_are_counted_in_json_as_the_text_says(cli, tmp_path):
    """A signature that changes with every value: the text said 'after 20 redraw(s)', the JSON
    nothing of them."""
    path = write(tmp_path / "everykink.py", '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class EveryValueSignature(Layer):
    """y = 2x, whose branch_signature is the input itself: every step changes it."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        self._x = x.copy()
        return 2 * x

    def backward(self, dy):
        return 2 * dy

    def branch_signature(self):
        return self._x
''')
    args = ("gradcheck", "EveryValueSignature", "--plugin", path, "--resample", "3")
    text = cli(*args)
    d = json.loads(cli(*args, "--json").out)
    assert "after 3 redraw(s) of the point" in text.out, text.out
    assert d["kinks"]["crossed"] == 4 * 3, d["kinks"]  # 2 shapes x 2 points, each redrawn 3 times
    assert "kinks: 12 point draw(s) with over 1% of their differences crossing a kink were redrawn" in text.out


def test_a_transposed_gradient_written_in_place_is_a_fail_naming_it(cli, tmp_path):
    """p.grad[...] = x.T @ dy: numpy refuses the broadcast; that was exit 2, as for a usage error."""
    with registered(AssignsTransposedGrad) as name:
        report = check_layer(name)
        square = check_layer(name, settings=Settings(dims="D=3,C=3"))
    r = cli("gradcheck", "AssignsTransposedGrad", "--plugin", plugin(tmp_path, AssignsTransposedGrad))
    assert report.verdict == FAIL and report.failed == ["weight", "grad-structure"], report.failed
    weight = _tensor(report, "weight")
    assert weight.status == FAIL and weight.shapes == [[4, 3]]
    assert any("weight: backward writes an array of shape (3, 4) into weight.grad, of shape (4, 3) (transposed"
               in n for n in weight.notes), weight.notes
    assert "each other's transpose" in report.error  # the raise itself, with its line, is still shown
    assert r.code == 1 and "RESULT AssignsTransposedGrad: FAIL (weight, grad-structure)" in r.out, r.out
    # square: it runs, and the pattern names the transpose
    assert any("is the transpose of the finite differences" in n for n in _tensor(square, "weight").notes)


def test_a_gradient_of_another_shape_written_in_place_is_a_fail_too(cli, tmp_path):
    rows = write(tmp_path / "rows.py", '''
from dlrun.layers.linear import Linear
from dlrun.registry import layers


@layers.register()
class RowSumBias(Linear):
    """Linear whose bias gradient sums over the wrong axis, written in place."""

    def backward(self, dy):
        self.weight.grad[...] = dy.T @ self._x
        self.bias.grad[...] = dy.sum(axis=1)
        return dy @ self.weight.data
''')
    r = cli("gradcheck", "RowSumBias", "--plugin", rows)
    assert r.code == 1 and "RESULT RowSumBias: FAIL (bias, grad-structure)" in r.out, r.out
    assert "bias: backward writes an array of shape (7,) into bias.grad, of shape (4,)" in r.out


def test_a_layer_computing_in_float32_is_pointed_at_dtype_float32(cli, tmp_path):
    args = ("gradcheck", "ComputesInFloat32", "--plugin", plugin(tmp_path, ComputesInFloat32))
    r64, r32 = cli(*args), cli(*args, "--dtype", "float32")
    assert r64.code == 1 and "check it with --dtype float32" in r64.out, r64.out
    assert "forward computes in float32" in r64.out
    assert r32.code == 0, r32.out


def test_float32_hints_stay_off_correct_float64_layers():
    report = check_layer("Linear")
    assert report.verdict == PASS and not any("--dtype float32" in n for t in report.tensors for n in t.notes)


def test_the_report_shows_the_options_it_built_the_layer_with(cli):
    report = check_layer("Linear")
    assert [b["layer"] for b in report.built] == ["Linear(units=4, use_bias=True, position_wise=False)", "Linear(units=2, use_bias=True, position_wise=False)"]
    assert report.built[0]["options"] == {"units": 4, "use_bias": True, "position_wise": False}
    r = cli("gradcheck", "Linear", "--dims", "C=7")
    assert r.out.splitlines()[0] == "gradcheck Linear(units=7, use_bias=True, position_wise=False)", r.out
    d = json.loads(cli("gradcheck", "Linear", "--dims", "C=7", "--set", "use_bias=false", "--json").out)
    assert d["built"] == [{"layer": "Linear(units=7, use_bias=False, position_wise=False)", "options": {"units": 7, "use_bias": False, "position_wise": False}}]
    assert check_layer("LargeMarginFC", {"k": 0.3}).built[0]["layer"] == "LargeMarginFC(units=4, k=0.3)"


def test_a_square_weight_is_forced_by_setting_an_option_to_a_dim(cli):
    """--set units=D binds units to D in each configuration (or the one --dims gives): a transposed
    square gradient then runs and is named in both; 'D' was refused as not a positive integer."""
    with registered(AssignsTransposedGrad) as name:
        report = check_layer(name, {"units": "D"})
    assert [b["layer"] for b in report.built] == [f"{name}(units=3, use_bias=True, position_wise=False)", f"{name}(units=5, use_bias=True, position_wise=False)"]
    weight = _tensor(report, "weight")
    assert weight.shapes == [[3, 3], [5, 5]] and report.error is None, (weight.shapes, report.error)
    assert any("is the transpose of the finite differences" in n for n in weight.notes), weight.notes
    r = cli("gradcheck", "Linear", "--set", "units=D", "--dims", "D=6")
    assert r.code == 0 and r.out.splitlines()[0] == "gradcheck Linear(units=6, use_bias=True, position_wise=False)", r.out
