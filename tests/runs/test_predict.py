"""`dlrun predict`: rebuilt from the checkpoint alone, CSV/.npy in, CSV out (file or stdout)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from checkpoint_helpers import read_csv, spiral_config, summary, train
from conftest import run_cli, write
from dlrun.runs import checkpoint
from dlrun.data import spiral


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict")
    cfg = spiral_config(tmp, epochs=8)
    run = train(cfg, tmp / "runs")
    cfg.unlink()  # predict must not need the YAML file
    x = spiral(classes=3, points_per_class=40, noise=0.2, seed=1).x
    np.save(tmp / "x.npy", x)
    np.savetxt(tmp / "x_header.csv", x, delimiter=",", header="x0,x1", comments="", fmt="%.17g")
    np.savetxt(tmp / "x_plain.csv", x, delimiter=",", fmt="%.17g")
    return run, tmp, x


def _numpy_logits(ckpt_path, x):
    """Independent forward pass: Linear -> ReLU -> Linear from the stored arrays, in float64."""
    a = checkpoint.read(ckpt_path).model
    h = np.maximum(x @ a["0.weight"].astype(np.float64).T + a["0.bias"], 0.0)
    return h @ a["2.weight"].astype(np.float64).T + a["2.bias"]


def test_predict_on_training_inputs_reproduces_summary_accuracy(trained, tmp_path):
    run, tmp, _ = trained
    ds = spiral(classes=3, points_per_class=40, noise=0.2, seed=1)
    from dlrun.data import split

    x_train, y_train, _, _ = split(ds.x, ds.y, 0.25, 3)  # the run's seeded split (seed 3)
    np.save(tmp_path / "train.npy", x_train)
    r = run_cli("predict", run / "checkpoints" / "last.npz", "--input", tmp_path / "train.npy")
    assert r.code == 0, r.err
    cols, values = read_csv(r.out)
    assert cols == ["prediction"] and len(values) == len(x_train)
    acc = float((values[:, 0] == y_train).mean())
    assert acc == summary(run)["final_train_accuracy"]


@pytest.mark.slow
def test_predict_csv_and_npy_to_stdout_and_file_match_an_independent_forward(trained, tmp_path):
    run, tmp, x = trained
    ckpt = checkpoint.resolve(run)
    assert ckpt.name == "best.npz"  # a run directory means its best checkpoint
    z = _numpy_logits(ckpt, x)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    outs = []
    for name in ("x.npy", "x_header.csv", "x_plain.csv"):
        r = run_cli("predict", run, "--input", tmp / name, "--proba", "--batch-size", "7")
        assert r.code == 0, r.err
        outs.append(r.out)
    assert outs[0] == outs[1] == outs[2]
    cols, values = read_csv(outs[0])
    assert cols == ["prediction", "proba_0", "proba_1", "proba_2"]
    assert np.array_equal(values[:, 0], z.argmax(axis=1))
    np.testing.assert_allclose(values[:, 1:], p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values[:, 1:].sum(axis=1), 1.0, atol=1e-6)
    out = tmp_path / "pred.csv"
    r = run_cli("predict", run, "--input", tmp / "x.npy", "--output", out)
    assert r.code == 0, r.err
    assert r.out == "" and "predictions written" in r.err
    cols, plain = read_csv(out.read_text())
    assert cols == ["prediction"] and np.array_equal(plain[:, 0], values[:, 0])


def test_predict_checks_the_feature_count(trained, tmp_path):
    run, tmp, x = trained
    np.savetxt(tmp_path / "with_labels.csv", np.c_[x, np.zeros(len(x))], delimiter=",")
    r = run_cli("predict", run, "--input", tmp_path / "with_labels.csv")
    assert r.code == 2
    assert "3 features per sample, but the model expects 2" in r.err and "labels" in r.err
    r = run_cli("predict", run, "--input", tmp_path / "missing.csv")
    assert r.code == 2 and "input file not found" in r.err


@pytest.mark.slow
def test_predict_regression_model_writes_values(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3
    np.savetxt(tmp_path / "reg.csv", np.c_[x, y], delimiter=",")
    cfg = write(tmp_path / "reg.yaml", """\
seed: 0
data: {type: file, path: reg.csv, task: regression}
model: [{type: Linear, units: 1}]
loss: MSE
optimizer: {type: SGD, learning_rate: 0.1}
train: {epochs: 3, batch_size: 16}
""")
    run = train(cfg, tmp_path / "runs")
    np.save(tmp_path / "xin.npy", x[:5])
    r = run_cli("predict", run, "--input", tmp_path / "xin.npy")
    assert r.code == 0, r.err
    cols, values = read_csv(r.out)
    a = checkpoint.read(checkpoint.resolve(run)).model
    expect = x[:5] @ a["0.weight"].astype(np.float64).T + a["0.bias"]
    assert cols == ["prediction"]
    np.testing.assert_allclose(values, expect, rtol=1e-5, atol=1e-6)
    r = run_cli("predict", run, "--input", tmp_path / "xin.npy", "--proba")
    assert r.code == 2 and "--proba needs a classification model" in r.err


def test_predict_proba_on_a_hinge_model_is_a_usage_error(tmp_path):
    """Hinge scores have no probabilities: --proba is refused in one line, before predicting."""
    cfg = write(tmp_path / "hinge.yaml", """\
data: {type: spiral, classes: 3, points_per_class: 10}
model: [{type: Linear, units: 3}]
loss: Hinge
optimizer: {type: SGD, learning_rate: 0.1}
train: {epochs: 2, batch_size: 10}
""")
    run = train(cfg, tmp_path / "runs")
    np.save(tmp_path / "xin.npy", np.zeros((2, 2)))
    r = run_cli("predict", run, "--input", tmp_path / "xin.npy", "--proba")
    assert r.code == 2 and "--proba: the loss Hinge defines no probabilities(z)" in r.err and "internal" not in r.err
    assert "Traceback" not in r.err
    r = run_cli("predict", run, "--input", tmp_path / "xin.npy")
    assert r.code == 0 and r.out.splitlines()[0] == "prediction"


PLUGIN = '''
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Doubler(Layer):
    """y = 2x."""

    def forward(self, x, y=None):
        return 2 * x

    def backward(self, dy):
        return 2 * dy
'''


@pytest.mark.slow
def test_predict_runs_plugin_layers_only_when_named_and_checks_the_recorded_source(tmp_path):
    plugin = write(tmp_path / "doubler.py", PLUGIN)
    cfg = write(tmp_path / "p.yaml", """\
seed: 0
plugins: [doubler.py]
data: {type: spiral, classes: 2, points_per_class: 10}
model: [Doubler, {type: Linear, units: 2}]
loss: SoftmaxCrossEntropy
optimizer: SGD
train: {epochs: 1}
""")
    run = train(cfg, tmp_path / "runs")
    np.save(tmp_path / "x.npy", np.zeros((2, 2)))
    r = run_cli("predict", run, "--input", tmp_path / "x.npy")  # a checkpoint never runs code by itself
    assert r.code == 2 and f"add --plugin {plugin.resolve()} to run it" in r.err, r.err
    r = run_cli("predict", run, "--input", tmp_path / "x.npy", "--plugin", plugin)
    assert r.code == 0 and "warning" not in r.err, r.err
    plugin.write_text(PLUGIN + "\n# edited\n")
    r = run_cli("predict", run, "--input", tmp_path / "x.npy", "--plugin", plugin)
    assert r.code == 0 and "warning:" in r.err and "changed since" in r.err and str(plugin.resolve()) in r.err
    plugin.unlink()
    r = run_cli("predict", run, "--input", tmp_path / "x.npy")
    assert r.code == 2 and "Doubler" in r.err and "missing" in r.err


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_layernorm_and_gelu_model_trains_and_predicts_like_an_independent_forward(tmp_path, approximate):
    import math

    cfg = write(tmp_path / "ln.yaml", f"""\
seed: 0
data: {{type: spiral, classes: 3, points_per_class: 30}}
model:
  - {{type: Linear, units: 16}}
  - {{type: LayerNorm}}
  - {{type: GELU, approximate: {approximate}}}
  - {{type: Linear, units: 3}}
loss: SoftmaxCrossEntropy
optimizer: {{type: Adam, learning_rate: 0.01}}
train: {{epochs: 5, batch_size: 30}}
""")
    run = train(cfg, tmp_path / "runs")
    x = spiral(classes=3, points_per_class=5, noise=0.2, seed=1).x
    np.save(tmp_path / "x.npy", x)
    r = run_cli("predict", run, "--input", tmp_path / "x.npy", "--proba")
    assert r.code == 0, r.err
    cols, values = read_csv(r.out)
    assert cols == ["prediction", "proba_0", "proba_1", "proba_2"]
    a = {k: v.astype(np.float64) for k, v in checkpoint.read(checkpoint.resolve(run)).model.items()}
    h = x @ a["0.weight"].T + a["0.bias"]
    h = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5) * a["1.gamma"] + a["1.beta"]
    if approximate == "tanh":
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    else:
        h = h * np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2)))(h)
    z = h @ a["3.weight"].T + a["3.bias"]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(values[:, 1:], p, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(values[:, 0], p.argmax(1))


def test_save_csv_is_atomic_and_leaves_special_files_alone(tmp_path, monkeypatch):
    from dlrun.runs import inference
    table = inference.PredictionTable(["prediction"], np.arange(3.0)[:, None], ["%d"])
    path = tmp_path / "pred.csv"
    inference.save_csv(table, path)
    assert path.read_text() == "prediction\n0\n1\n2\n"

    def fail_midway(t, f):  # a full disk after the header
        f.write("prediction\n")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inference, "write_csv", fail_midway)
    with pytest.raises(OSError):
        inference.save_csv(table, path)
    with pytest.raises(OSError):
        inference.save_csv(table, tmp_path / "new.csv")
    monkeypatch.undo()
    assert path.read_text() == "prediction\n0\n1\n2\n"  # the earlier file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred.csv"]  # no partial or temporary file
    inference.save_csv(table, "/dev/null")  # written through, not replaced by a regular file
    assert Path("/dev/null").is_char_device()


def test_predict_to_an_unwritable_output_is_a_usage_error(trained, tmp_path):
    run, tmp, _ = trained
    r = run_cli("predict", run, "--input", tmp / "x.npy", "--output", tmp_path / "no_dir" / "p.csv")
    assert r.code == 2 and "--output" in r.err and "cannot write" in r.err and "Traceback" not in r.err
    r = run_cli("predict", run, "--input", tmp / "x.npy", "--output", tmp_path)
    assert r.code == 2 and "cannot write" in r.err
    assert list(tmp_path.iterdir()) == []


def test_predict_to_a_full_disk_fails_like_a_run_not_like_usage(trained, tmp_path, monkeypatch, capsys):
    # it exited 2 ("usage"), where train's full disk exits 1
    from dlrun.runs import inference
    from dlrun.cli import main

    run, tmp, _ = trained

    def full(table, f):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(inference, "write_csv", full)
    with pytest.raises(SystemExit) as e:
        main(["predict", str(run), "--input", str(tmp / "x.npy"), "--output", str(tmp_path / "p.csv")])
    assert e.value.code == 1
    assert "cannot write the file (No space left on device); nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_predict_refuses_empty_archive_and_out_of_range_inputs(trained, tmp_path):
    run, _, _ = trained
    np.save(tmp_path / "empty.npy", np.zeros((0, 2)))
    np.save(tmp_path / "scalar.npy", np.float64(3.0))
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 2)))
    (tmp_path / "big.csv").write_text("x0,x1\n1e39,1\n")
    for name, text in (("empty.npy", "holds no samples"), ("scalar.npy", "expected one sample per row"),
                       ("x.npz", "got an .npz archive"),
                       ("big.csv", "beyond the range of float32")):
        r = run_cli("predict", run, "--input", tmp_path / name)
        assert r.code == 2 and text in r.err and r.out == "", (name, r.err)


def test_shaped_samples_are_never_recut():
    from dlrun.errors import DataError
    from dlrun.runs.inference import shape_features

    assert shape_features(np.zeros((3, 8, 8)), (1, 8, 8), "x").shape == (3, 1, 8, 8)  # a unit axis added
    assert shape_features(np.zeros((3, 64)), (1, 8, 8), "x").shape == (3, 1, 8, 8)  # flat rows
    with pytest.raises(DataError, match=r"samples of shape \(1, 4, 16\), but the model expects \(1, 8, 8\)"):
        shape_features(np.zeros((3, 1, 4, 16)), (1, 8, 8), "x")


def test_a_label_column_hint_suggests_evaluate_only_outside_evaluate():
    from dlrun.errors import DataError
    from dlrun.runs.inference import shape_features

    x = np.zeros((4, 3))
    with pytest.raises(DataError, match=r"drop it, or use dlrun evaluate\)"):
        shape_features(x, (2,), "in.csv")
    with pytest.raises(DataError, match=r"\(if the last column holds labels, drop it\)$"):
        shape_features(x, (2,), "--data {type: file, path: in.csv}")
