"""`dlrun gradcheck` end to end: exit codes, table, JSON, --all, CONFIG.yaml, plugins."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, write

BROKEN = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class HalfReQU(Layer):
    """z = x² where x > 0 (backward forgets the factor 2)."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        self._x = x * (x > 0)
        return self._x ** 2

    def backward(self, dy):
        return dy * self._x


@layers.register()
class Raises(Layer):
    """Backward raises."""

    def forward(self, x):
        return x * 1.0

    def backward(self, dy):
        raise RuntimeError("not written yet")
'''


def test_pass_prints_table_aux_and_verdict(cli):
    r = cli("gradcheck", "LargeMarginFC")
    assert r.code == 0, r.err
    for text in ("weight", "zero-upstream", "reentrant", "inputs-unchanged", "second-point", "RESULT LargeMarginFC: PASS"):
        assert text in r.out


def test_fail_names_the_tensor_with_worst_element(cli, tmp_path):
    plugin = write(tmp_path / "broken.py", BROKEN)
    r = cli("gradcheck", "HalfReQU", "--plugin", plugin)
    assert r.code == 1, r.out + r.err
    assert "RESULT HalfReQU: FAIL (x)" in r.out
    # the table's columns, then a line per tensor: its band and worst element, with where it failed
    assert all(c in r.out for c in ("tensor", "checked", "skipped", "max abs", "max rel", "sym rel", "result"))
    line = next(ln.strip() for ln in r.out.splitlines() if ln.strip().startswith("x: "))
    assert line.startswith("x: wrong; worst x[") and "(tol " in line and "point " in line, line
    analytic, numeric = (float(v.split()[-1]) for v in line.split("]: ")[1].split(" (")[0].split(", "))
    assert abs(2 * analytic - numeric) < 1e-4 * abs(numeric), line
    j = json.loads(cli("gradcheck", "HalfReQU", "--plugin", plugin, "--json").out)
    x = j["tensors"][0]
    assert j["result"] == "FAIL" and x["name"] == "x" and x["status"] == "FAIL"
    assert abs(x["worst"]["analytic"] * 2 - x["worst"]["numeric"]) < 1e-4


def test_cannot_run_exits_2_with_reason(cli, tmp_path):
    r = cli("gradcheck", "LargeMarginFc")
    assert r.code == 2 and "did you mean LargeMarginFC" in r.err
    r = cli("gradcheck", "LargeMarginFC", "--set", "k=1.5")
    assert r.code == 2 and "k" in r.err and "1.5" in r.err
    r = cli("gradcheck", "LargeMarginFC", "--set", "kk=0.5")
    assert r.code == 2 and "did you mean k" in r.err
    plugin = write(tmp_path / "broken.py", BROKEN)
    r = cli("gradcheck", "Raises", "--plugin", plugin)
    assert r.code == 2 and "backward raised RuntimeError: not written yet" in r.out


def test_json_settings_and_float32_warning(cli):
    r = cli("gradcheck", "ReQU", "--dtype", "float32", "--json")
    j = json.loads(r.out)
    assert r.code == 0 and j["settings"]["dtype"] == "float32" and j["warnings"]
    # the float64 copy is differenced with float64's step; float32's is kept for a fallback
    assert (j["settings"]["eps"], j["settings"]["float32_eps"]) == (1e-6, 1e-3)
    r = cli("gradcheck", "ReQU", "--dtype", "float32")
    assert "warning" in r.err and "float32" in r.err
    j = json.loads(cli("gradcheck", "ReQU", "--eps", "1e-5", "--atol", "1e-4", "--seed", "3", "--json").out)
    assert (j["settings"]["eps"], j["settings"]["atol"], j["settings"]["seed"]) == (1e-5, 1e-4, 3)


@pytest.mark.slow
def test_all_checks_every_layer_and_plugins(cli, tmp_path):
    r = cli("gradcheck", "--all", "--plugin", ROOT / "examples" / "my_layer.py")
    assert r.code == 0, r.out
    for name in ("LargeMarginFC", "LSoftmax", "ReQU", "MultiplyByTwo", "MinMaxNormalization", "NormalizedDense", "MyMarginFC"):
        assert name in r.out
    plugin = write(tmp_path / "broken.py", BROKEN)
    r = cli("gradcheck", "--all", "--plugin", plugin)
    assert r.code == 1 and "HalfReQU" in r.out and "not passing: HalfReQU, Raises" in r.out


def test_all_summary_keeps_one_line_per_check_at_80_columns_and_lists_problems_below(cli, tmp_path):
    r = cli("gradcheck", "--all", "--dtype", "float32", "--plugin", write(tmp_path / "broken.py", BROKEN),
            env={"COLUMNS": "80"})
    assert r.code == 1, r.out + r.err
    lines = r.out.splitlines()
    table = lines[:lines.index("  HalfReQU: FAIL x")]
    assert max(len(line.rstrip()) for line in table) <= 80
    rows = {line.split()[0]: line.split() for line in table if line.strip().endswith(("PASS", "FAIL", "ERROR"))}
    # every check on one line, its name whole: name, checked, skipped, sym rel, band..., time, result
    assert {"SoftmaxCrossEntropy", "MinMaxNormalization", "HalfReQU", "Raises", "BatchNorm"} <= set(rows)
    assert rows["HalfReQU"][-1] == "FAIL" and rows["HalfReQU"][-2].endswith("s")
    assert any(row[4:-2] == ["ok", "with", "kinks"] for row in rows.values())  # float32 puts some in that band
    assert "  HalfReQU: FAIL x" in lines
    assert r.err.count("warning: float32 check") == 1  # said once for the whole run, as for one check
    assert any(line.startswith("  Raises: ERROR ") for line in lines)


def test_config_checks_whole_model_then_each_layer_and_the_loss(cli):
    r = cli("gradcheck", "configs/iris_requ.yaml", "--json")
    j = json.loads(r.out)
    assert r.code == 0, r.out
    assert [t["name"] for t in j["tensors"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [c["layer"] for c in j["children"]] == ["model[0] Linear", "model[1] ReQU", "model[2] Linear",
                                                  "loss SoftmaxCrossEntropy"]
    assert all(c["result"] == "PASS" for c in j["children"])


def test_example_plugin_workflow(cli, tmp_path):
    r = cli("gradcheck", "MyMarginFC", "--plugin", "examples/my_layer.py")
    assert r.code == 0, r.out
    r = cli("train", "examples/my_layer.yaml", "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    summary = json.loads((tmp_path / r.out.strip().splitlines()[-1].split("/")[-1] / "summary.json").read_text())
    assert summary["train_accuracy"] >= 0.95


SUBTLE = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class NearlyTriple(Layer):
    """y = 3x; backward is off by a relative 1e-4 (within the default rtol, not within --strict's)."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        return 3.0 * x

    def backward(self, dy):
        return dy * 3.0003


@layers.register()
class Jittery(Layer):
    """y = 2x; backward's result jitters by 1e-14 relative, from an unseeded generator (as GPU atomics do)."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        return 2.0 * x

    def backward(self, dy):
        import numpy

        return 2.0 * dy * (1 + 1e-14 * numpy.random.default_rng().random(dy.shape)).astype(dy.dtype)


@layers.register()
class EvalWrong(Layer):
    """y = 2x in training, 3x in evaluation; backward always returns 2·dy."""

    input_spec = InputSpec(shape=("D",))
    has_phase = True

    def forward(self, x):
        return (2.0 if self.training else 3.0) * x

    def backward(self, dy):
        return 2.0 * dy
'''


def test_strict_tolerances_catch_a_relative_error_the_defaults_accept(cli, tmp_path):
    plugin = write(tmp_path / "subtle.py", SUBTLE)
    r = cli("gradcheck", "NearlyTriple", "--plugin", plugin)
    assert r.code == 0, r.out + r.err
    r = cli("gradcheck", "NearlyTriple", "--plugin", plugin, "--strict", "--json")
    j = json.loads(r.out)
    assert r.code == 1 and j["result"] == "FAIL" and (j["settings"]["atol"], j["settings"]["rtol"]) == (1e-7, 1e-6)
    assert cli("gradcheck", "LargeMarginFC", "--strict").code == 0  # correct layers pass it
    r = cli("gradcheck", "ReQU", "--strict", "--dtype", "float32")
    assert r.code == 2 and "--strict needs --dtype float64" in r.err


def test_phase_selects_training_evaluation_or_both(cli, tmp_path):
    plugin = write(tmp_path / "subtle.py", SUBTLE)
    for phase, code, shown in (("train", 0, "train"), ("eval", 1, "eval"), ("both", 1, "train+eval"),
                               ("auto", 1, "train+eval")):
        r = cli("gradcheck", "EvalWrong", "--plugin", plugin, "--phase", phase, "--json")
        assert r.code == code, (phase, r.out + r.err)
        assert json.loads(r.out)["settings"]["phase"] == shown
    assert json.loads(cli("gradcheck", "ReQU", "--json").out)["settings"]["phase"] == "train"  # no phase: train only
    r = cli("gradcheck", "ReQU", "--phase", "test")
    assert r.code == 2 and "--phase must be one of auto, train, eval, both" in r.err


def test_points_samples_and_directions_set_how_much_is_checked(cli):
    def checked(*args):
        r = cli("gradcheck", "Linear", "--json", *args)
        assert r.code == 0, r.out + r.err
        return {t["name"]: (t["checked"], [int(np.prod(s)) for s in t["shape"]]) for t in json.loads(r.out)["tensors"]}

    two, one = checked(), checked("--points", "1")
    for name, (count, sizes) in one.items():  # every element of every tensor, in each shape configuration
        assert count == sum(sizes) and two[name][0] == 2 * count, name
    for name, (count, sizes) in checked("--mode", "sampled", "--samples", "3", "--points", "1").items():
        assert count == sum(min(3, s) for s in sizes), name  # 3 elements per tensor and configuration
    for name, (count, sizes) in checked("--mode", "fast", "--directions", "5", "--points", "1").items():
        assert count == 5 * len(sizes), name  # 5 directions per tensor and configuration
    for bad in (("--points", "0"), ("--samples", "0"), ("--directions", "0"), ("--resample", "-1")):
        r = cli("gradcheck", "Linear", *bad)
        assert r.code == 2 and f"{bad[0]} must be at least" in r.err


def test_pass_names_the_element_with_the_largest_gap(cli):
    # a PASS shows the largest abs(a − n), not argmax(abs(a − n) − tol): that is nearly always an
    # element whose gradients are both 0, which says nothing
    r = cli("gradcheck", "Linear")
    assert r.code == 0, r.err
    j = json.loads(cli("gradcheck", "Linear", "--json").out)
    for t in j["tensors"]:
        gap = abs(t["largest"]["analytic"] - t["largest"]["numeric"])
        assert gap == t["max_abs"] > 0, t
        assert t["worst"]["index"] != t["largest"]["index"] or t["name"] == "bias", t
        line = next(ln.strip() for ln in r.out.splitlines() if ln.strip().startswith(f"{t['name']}: "))
        assert f"largest gap {t['name']}[{','.join(map(str, t['largest']['index']))}]: " in line, line
        assert line.endswith(f"({gap:.1e})") and "worst" not in line, line
    # exact agreement everywhere (ReLU's Jacobian: 1 = (x + h − (x − h)) / 2h to the bit) is said so
    r = cli("gradcheck", "ReLU", "--mode", "jacobian")
    assert "x: happy; backward and finite differences agree exactly on every element" in r.out, r.out


def test_jacobian_mode_compares_every_entry_and_names_the_output(cli, tmp_path):
    j = json.loads(cli("gradcheck", "Linear", "--mode", "jacobian", "--points", "1", "--json").out)
    assert j["result"] == "PASS"
    x = next(t for t in j["tensors"] if t["name"] == "x")
    w = next(t for t in j["tensors"] if t["name"] == "weight")
    # per shape configuration: every output element (N x units) against every element of the tensor
    assert x["checked"] == 7 * 4 * (7 * 3) + 3 * 2 * (3 * 5)
    assert w["checked"] == 7 * 4 * (4 * 3) + 3 * 2 * (2 * 5)
    plugin = write(tmp_path / "broken.py", BROKEN)
    r = cli("gradcheck", "HalfReQU", "--plugin", plugin, "--mode", "jacobian", "--json")
    worst = json.loads(r.out)["tensors"][0]["worst"]
    assert r.code == 1
    # an elementwise layer: the wrong entry is on the diagonal, d out[i,j] / d x[i,j]
    assert f"d out[{','.join(map(str, worst['index']))}] / d x" in worst["where"]
    largest = json.loads(r.out)["tensors"][0]["largest"]
    assert f"d out[{','.join(map(str, largest['index']))}] / d x" in largest["where"]
    r = cli("gradcheck", "Conv2D", "--mode", "jacobian")
    assert r.code == 2 and "Jacobian entries, more than 250,000; use --mode auto" in r.out
    # outputs that are views of the input (Flatten; Dropout in evaluation) must be copied
    # before the input is perturbed again, or every difference reads 0
    for layer in ("Flatten", "Dropout"):
        r = cli("gradcheck", layer, "--mode", "jacobian", "--dims", "N=2,C=2,H=2,W=3,D=4")
        assert r.code == 0, r.out + r.err


def test_dims_checks_one_configuration_of_the_given_sizes(cli):
    j = json.loads(cli("gradcheck", "Linear", "--dims", "N=2, D=4,C=3", "--mode", "jacobian", "--json").out)
    x = next(t for t in j["tensors"] if t["name"] == "x")
    assert j["result"] == "PASS" and x["shape"] == [[2, 4]] and x["checked"] == 2 * (2 * 3) * (2 * 4)
    assert j["settings"]["dims"].startswith("N=2,D=4,C=3,")
    r = cli("gradcheck", "Linear", "--dims", "n=2")
    assert r.code == 2 and "unknown dim 'n' (did you mean N?)" in r.err
    r = cli("gradcheck", "Linear", "--dims", "N=two")
    assert r.code == 2 and "must be NAME=POSITIVE_INTEGER" in r.err


def test_nondet_tol_lets_backward_passes_differ_by_that_much(cli, tmp_path):
    plugin = write(tmp_path / "subtle.py", SUBTLE)
    r = cli("gradcheck", "Jittery", "--plugin", plugin)
    assert r.code == 1 and "reentrant" in r.out and "FAIL" in r.out
    assert cli("gradcheck", "Jittery", "--plugin", plugin, "--nondet-tol", "1e-12").code == 0
    r = cli("gradcheck", "Jittery", "--plugin", plugin, "--nondet-tol", "-1")
    assert r.code == 2 and "--nondet-tol must be a non-negative number" in r.err


def test_float32_check_passes_batchnorm_and_fails_a_real_bug_without_a_rounding_note(cli, tmp_path):
    # BatchNorm failed here on float32 rounding of L over its 840 outputs; a float64 copy is
    # differenced now (tests/test_gradcheck_float32.py has the fallback and its rounding note)
    r = cli("gradcheck", "BatchNorm", "--dtype", "float32", "--json")
    assert r.code == 0 and json.loads(r.out)["tensors"][0]["sym_rel"] < 1e-5, r.out
    # a real bug is far outside rounding: no such note
    plugin = write(tmp_path / "broken.py", BROKEN)
    x = json.loads(cli("gradcheck", "HalfReQU", "--plugin", plugin, "--dtype", "float32", "--json").out)["tensors"][0]
    assert x["status"] == "FAIL" and not any("float32 rounding" in n for n in x["notes"])


@pytest.mark.slow
def test_config_check_moves_off_kinks_of_zero_biases_and_keeps_shapes_whole_at_80_columns(cli):
    """digits_cnn: zero biases on zero pixels put the first ReLUs exactly on their kink, so at the
    initial parameters every element of 0.bias crossed it; the check then jitters the parameters
    and compares every bias element. In an 80-column pipe each shape stays on one line."""
    r = cli("gradcheck", "configs/digits_cnn.yaml", env={"COLUMNS": "80"})
    assert r.code == 0, r.out + r.err
    assert "plus N(0, 0.01²) noise on every trainable parameter" in r.err
    row = next(line for line in r.out.splitlines() if line.lstrip().startswith("0.bias"))
    assert row.split()[1:5] == ["(32)", "exhaustive", "32", "0"]  # shape, mode, checked, skipped
    assert any("(64,32,3,3)" in line for line in r.out.splitlines())


def test_a_tensor_with_nothing_compared_is_not_reported_as_a_pass():
    from dlrun.cli.gradcheck import tensor_line
    from dlrun.gradcheck.numeric import TensorRun
    from dlrun.gradcheck.report import NA, PASS
    from dlrun.gradcheck.runner import merge

    results = {}
    merge(results, TensorRun("b", "param", (4,), "float64", "exhaustive", checked=0, skipped=4))
    assert results["b"].status == NA
    assert tensor_line(results["b"]) == "b: not compared: the difference of each of its 4 element(s) crossed a kink"
    merge(results, TensorRun("b", "param", (4,), "float64", "exhaustive", checked=3, skipped=1))
    assert results["b"].status == PASS
    merge(results, TensorRun("b", "param", (4,), "float64", "exhaustive", checked=4, failed=True))
    merge(results, TensorRun("b", "param", (4,), "float64", "exhaustive", checked=0, skipped=4))
    assert results["b"].status == "FAIL"  # a failure is never overwritten


def test_dims_with_barely_repeated_labels_warn_that_a_dropped_repeat_may_pass(cli):
    r = cli("gradcheck", "LargeMarginFC", "--dims", "N=3,D=3,C=3")
    assert r.code == 0 and "warning: few repeated labels: with N=3 rows for 3 classes only one label repeats" in r.err
    r = cli("gradcheck", "LargeMarginFC")  # the default configurations include one with many repeats
    assert r.code == 0 and "few repeated labels" not in r.err


LABELLED = '''
import numpy as np
from dlrun.layers import InputSpec, Layer
from dlrun.api import PositiveInt
from dlrun.registry import layers


@layers.register()
class CenterOffset(Layer):
    """out_i = x_i − W[y_i], labels drawn from the `classes` option (the dim C)."""

    needs_labels = True
    input_spec = InputSpec(shape=("D",), labels="C", options={"classes": "C"})

    def __init__(self, classes: PositiveInt = 3):
        self.classes = classes

    def build(self, input_shape):
        self.weight = self.add_param("weight", (self.classes, input_shape[0]), "zeros")
        return tuple(input_shape)

    def forward(self, x, y=None):
        self._y = y
        return x - self.weight.data[y]

    def backward(self, dy):
        self.weight.grad.fill(0)
        np.add.at(self.weight.grad, self._y, -dy)
        return dy
'''


def test_config_check_of_a_layer_whose_labels_are_a_dim_bound_to_an_option(cli, tmp_path):
    """Inside a model there are no --dims: the labels' dim C is read from the option bound to it
    (was: 'internal error: ValueError: invalid literal for int()')."""
    write(tmp_path / "offset.py", LABELLED)
    cfg = write(tmp_path / "c.yaml", "plugins: [offset.py]\ndata: {type: spiral, classes: 3, points_per_class: 20}\n"
                "model:\n  - {type: Linear, units: 4}\n  - {type: CenterOffset, classes: 3}\n  - {type: Linear, units: 3}\n"
                "loss: SoftmaxCrossEntropy\noptimizer: SGD\n")
    r = cli("gradcheck", str(cfg))
    assert r.code == 0, r.out + r.err
    assert "RESULT model[1] CenterOffset: PASS" in r.out
    r = cli("gradcheck", "CenterOffset", "--plugin", str(tmp_path / "offset.py"), "--set", "classes=2")
    assert r.code == 0, r.out + r.err  # labels follow the option, not the dim C=4 (was an IndexError)
    broken = LABELLED.replace("self.weight.grad.fill(0)", "self.weight.grad[np.unique(self._y)] = 0")
    write(tmp_path / "offset.py", broken)
    r = cli("gradcheck", "CenterOffset", "--plugin", str(tmp_path / "offset.py"))
    assert r.code == 1 and "backward did not write every element of weight.grad" in r.out


def test_a_whole_model_whose_loss_is_not_one_function_is_not_differenced(cli, tmp_path):
    """A layer masking with numpy's global generator made every parameter of the whole-model
    check FAIL with absurd numbers (numeric 127892) and no reason; the model check now stops."""
    write(tmp_path / "globaldrop.py", '''
import numpy as np
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class GlobalDrop(Layer):
    """Dropout whose mask comes from numpy's global generator."""

    def forward(self, x, y=None):
        self._m = (np.random.random(x.shape) > 0.5) * 2.0
        return x * self._m

    def backward(self, dy):
        return dy * self._m
''')
    cfg = write(tmp_path / "m.yaml", """\
seed: 0
plugins: [globaldrop.py]
data: {type: spiral, points_per_class: 20}
model: [{type: Linear, units: 8}, Tanh, GlobalDrop, {type: Linear, units: 3}]
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.1}
""")
    r = cli("gradcheck", cfg)
    assert r.code == 2, r.out + r.err
    assert "the model's loss differs between two evaluations at the same point" in r.out + r.err
    assert "0.weight" not in r.out  # no parameter was differenced
    assert "RESULT model[2] GlobalDrop: ERROR" in r.out


def test_every_checker_setting_is_an_option_with_its_documented_help(cli):
    """The options are generated from gradcheck.Settings: a new setting is an option at once,
    with its docstring entry as the help (nothing is declared twice)."""
    import inspect
    from dataclasses import fields

    from dlrun.cli.gradcheck import HIDDEN, _documented, gradcheck_cmd
    from dlrun.gradcheck import Settings

    params = inspect.signature(gradcheck_cmd).parameters
    documented = _documented(Settings)
    for f in fields(Settings):
        if f.name in HIDDEN:
            assert f.name not in params
            continue
        option = params[f.name].default
        assert option.param_decls == (f"--{f.name.replace('_', '-')}",) and option.default == f.default, f.name
        assert option.help == documented[f.name] and len(option.help) > 20, f.name
    r = cli("gradcheck", "Linear", "--max-exhaustive", "10", "--json")
    assert r.code == 0 and json.loads(r.out)["result"] == "PASS", r.err


def test_dims_too_large_for_the_memory_left_are_refused_with_the_figure_before_allocating(cli, monkeypatch):
    import dlrun.backend.memory

    monkeypatch.setattr(dlrun.backend.memory, "host_memory_available", lambda: 2**30)  # 1 GiB left, on any machine
    r = cli("gradcheck", "Linear", "--dims", "N=10000000")
    assert r.code == 2 and "Traceback" not in r.err
    assert ("out of memory: Linear's check with x of shape (10000000, 3) in float64 needs about 2.1 GiB, more than "
            "the 1.0 GiB of memory available") in r.err, r.err
    assert cli("gradcheck", "Linear", "--dims", "N=1000").code == 0  # 1000 rows fit


def test_under_a_real_address_space_limit_gradcheck_refuses_instead_of_being_killed(tmp_path):
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    r = subprocess.run([sys.executable, "-m", "dlrun", "gradcheck", "Linear", "--dims", "N=300000000"],
                       capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert r.returncode == 2 and "needs about 62.6 GiB, more than the" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
