"""LSTM, GRU and SimpleRNN: outputs and every gradient against PyTorch's nn.LSTM / nn.GRU / nn.RNN
on the same weights (an independent implementation; skipped without torch), the recurrences
written out for short sequences, the forget-gate bias, shape errors, and sequence models that learn."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import CONFIGS, run_cli, write
from dlrun import registry
from dlrun.backend import CPU
from dlrun.config import config_from_dict
from dlrun.errors import ConfigError
from dlrun.runs.assembly import assemble
from dlrun.runs.run import train
from torch_recurrent import assert_weight_gradients_equal, copy_weights, outputs_and_input_gradient, twin


def _layer(name, x_shape, **options):
    layer = registry.layers.build({"type": name, **options})
    layer.setup(CPU, np.float64, np.random.default_rng(1), CPU.rng(0))
    out_shape = layer.build(x_shape)
    return layer, out_shape


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("name", ["LSTM", "GRU", "SimpleRNN"])
def test_outputs_and_gradients_equal_pytorch(name, return_sequences):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    n, steps, d, units = 4, 5, 3, 6
    layer, _ = _layer(name, (steps, d), units=units, return_sequences=return_sequences,
                      bias_initializer={"type": "normal", "std": 0.3})
    x = rng.standard_normal((n, steps, d))
    out = layer.forward(x)
    dy = rng.standard_normal(out.shape)
    dx = layer.backward(dy)

    ref = twin(torch, name, layer, d)
    want, want_dx = outputs_and_input_gradient(torch, ref, x, dy, return_sequences)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-12)
    assert_weight_gradients_equal(layer, ref, name)


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("name", ["LSTM", "GRU", "SimpleRNN"])
def test_the_training_loops_reused_arrays_give_pytorchs_outputs_and_gradients(name, return_sequences, use_bias):
    """As the trainer runs a layer: scratch arrays reused across batches (of two sizes, the last
    batch of an epoch being smaller), no input gradient for the first layer."""
    torch = pytest.importorskip("torch")
    from dlrun.model import Sequential

    rng = np.random.default_rng(2)
    steps, d, units = 5, 3, 6
    bias = {"bias_initializer": {"type": "normal", "std": 0.3}} if use_bias else {}
    layer = registry.layers.build({"type": name, "units": units, "return_sequences": return_sequences,
                                   "use_bias": use_bias, **bias})
    model = Sequential([layer], (steps, d), CPU, np.float64, seed=0).train(True, fast=True)
    ref = twin(torch, name, layer, d)
    for n in (4, 2, 4, 4):
        layer.weight.data += 0.01 * rng.standard_normal(layer.weight.data.shape)  # the weights move, as in training
        copy_weights(torch, ref, layer, name)
        ref.zero_grad()
        x = rng.standard_normal((n, steps, d))
        out = model.forward(x)
        dy = rng.standard_normal(out.shape)
        assert model.backward(dy) is None  # the first layer computes no input gradient
        want, _ = outputs_and_input_gradient(torch, ref, x, dy, return_sequences)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
        assert_weight_gradients_equal(layer, ref, name)


def test_lstm_recurrence_written_out_for_two_steps():
    rng = np.random.default_rng(2)
    layer, out_shape = _layer("LSTM", (2, 3), units=2, return_sequences=True,
                              bias_initializer={"type": "normal", "std": 0.5})
    assert out_shape == (2, 2)
    w, u, b = layer.weight.data, layer.recurrent.data, layer.bias.data
    x = rng.standard_normal((3, 2, 3))
    h, c, want = np.zeros((3, 2)), np.zeros((3, 2)), []
    for t in range(2):
        a = x[:, t] @ w.T + h @ u.T + b
        i, f, g, o = _sigmoid(a[:, 0:2]), _sigmoid(a[:, 2:4]), np.tanh(a[:, 4:6]), _sigmoid(a[:, 6:8])
        c = f * c + i * g
        h = o * np.tanh(c)
        want.append(h)
    np.testing.assert_allclose(layer.forward(x), np.stack(want, axis=1), rtol=1e-13, atol=1e-15)


def test_gru_recurrence_written_out_for_two_steps():
    rng = np.random.default_rng(4)
    layer, _ = _layer("GRU", (2, 3), units=2, return_sequences=True, bias_initializer={"type": "normal", "std": 0.5})
    w, u, b, bu = layer.weight.data, layer.recurrent.data, layer.bias.data, layer.params["recurrent_bias"].data
    assert w.shape == (6, 3) and u.shape == (6, 2) and bu.shape == (6,) and bu.any()
    x = rng.standard_normal((3, 2, 3))
    h, want = np.zeros((3, 2)), []
    for t in range(2):
        a, v = x[:, t] @ w.T + b, h @ u.T + bu
        r, z = _sigmoid(a[:, 0:2] + v[:, 0:2]), _sigmoid(a[:, 2:4] + v[:, 2:4])
        n = np.tanh(a[:, 4:6] + r * v[:, 4:6])
        h = (1 - z) * n + z * h
        want.append(h)
    np.testing.assert_allclose(layer.forward(x), np.stack(want, axis=1), rtol=1e-13, atol=1e-15)


def test_simple_rnn_recurrence_written_out_for_three_steps():
    rng = np.random.default_rng(3)
    layer, out_shape = _layer("SimpleRNN", (3, 2), units=4)
    assert out_shape == (4,)
    w, u, b = layer.weight.data, layer.recurrent.data, layer.bias.data
    x = rng.standard_normal((5, 3, 2))
    h = np.zeros((5, 4))
    for t in range(3):
        h = np.tanh(x[:, t] @ w.T + h @ u.T + b)
    np.testing.assert_allclose(layer.forward(x), h, rtol=1e-13, atol=1e-15)


def test_lstm_forget_bias_starts_at_one_unless_turned_off():
    layer, _ = _layer("LSTM", (4, 3), units=5)
    assert layer.bias.data.tolist() == [0.0] * 5 + [1.0] * 5 + [0.0] * 10
    assert layer.weight.data.shape == (20, 3) and layer.recurrent.data.shape == (20, 5)
    off, _ = _layer("LSTM", (4, 3), units=5, unit_forget_bias=False)
    assert not off.bias.data.any()
    u = layer.recurrent.data
    np.testing.assert_allclose(u.T @ u, np.eye(5), atol=1e-12)  # orthogonal columns


def test_a_recurrent_layer_on_flat_input_names_the_shape_it_needs():
    raw = {"seed": 0, "data": {"type": "blobs", "samples": 40},
           "model": [{"type": "Linear", "units": 4}, {"type": "LSTM", "units": 3}, {"type": "Linear", "units": 3}],
           "loss": "SoftmaxCrossEntropy", "optimizer": {"type": "Adam", "learning_rate": 0.01}}
    with pytest.raises(ConfigError) as e:
        assemble(config_from_dict(raw))
    assert "model[1]: LSTM expects (N, steps, features) input" in str(e.value)
    assert "got input of shape (4,) per sample" in str(e.value)


def test_a_sequence_given_where_a_vector_is_read_points_at_return_sequences():
    raw = {"seed": 0, "data": {"type": "adding", "samples": 40, "steps": 5},
           "model": [{"type": "GRU", "units": 3, "return_sequences": True}, {"type": "Linear", "units": 1}],
           "loss": "MSE", "optimizer": {"type": "Adam", "learning_rate": 0.01}}
    with pytest.raises(ConfigError) as e:
        assemble(config_from_dict(raw))
    assert ("model[1]: Linear expects (N, features) input; add a Flatten before it, or set position_wise: true to apply it to "
            "each step, got input of shape (5, 3) per "
            "sample (model[0] gives every step, return_sequences: true; set it to false for the last state)") in str(e.value)


def test_the_adding_problem_targets_are_the_marked_sums():
    ds = registry.data.build({"type": "adding", "samples": 50, "steps": 7, "seed": 4})
    assert ds.x.shape == (50, 7, 2) and ds.y.shape == (50, 1)
    marks = ds.x[:, :, 1]
    assert (marks.sum(axis=1) == 2).all() and (marks[:, :3].sum(axis=1) == 1).all()
    np.testing.assert_allclose(ds.y[:, 0], (ds.x[:, :, 0] * marks).sum(axis=1))


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_the_shipped_lstm_config_learns_to_add(tmp_path, layer):
    r = run_cli("train", CONFIGS / "adding_lstm.yaml", "--runs-dir", tmp_path, "--set", f"model[0].type={layer}")
    assert r.code == 0, r.err
    summary = json.loads((tmp_path / r.out.strip().splitlines()[-1].split("/")[-1] / "summary.json").read_text())
    assert summary["val_loss"] < 0.005, summary  # predicting the mean scores 1/6 (seed 0 reaches 0.0004)


@pytest.mark.slow
def test_tokens_through_embedding_and_lstm_learn_which_token_came_first(tmp_path):
    """Embedding -> LSTM -> Linear on integer sequences: the label is the first token, so the
    LSTM must keep it across the whole sequence (a bag of tokens cannot tell)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (600, 8)).astype(np.float64)
    y = x[:, 0].astype(np.int64)
    np.savez(tmp_path / "tokens.npz", x=x, y=y)
    raw = {"seed": 0, "data": {"type": "file", "path": str(tmp_path / "tokens.npz"), "features_key": "x",
                               "labels_key": "y"},
           "model": [{"type": "Embedding", "input_dim": 4, "output_dim": 8}, {"type": "LSTM", "units": 16},
                     {"type": "Linear", "units": 4}],
           "loss": "SoftmaxCrossEntropy", "optimizer": {"type": "Adam", "learning_rate": 0.02},
           "train": {"epochs": 15, "batch_size": 32, "validation_split": 0.2}}
    result = train(config_from_dict(raw), tmp_path / "runs")
    assert result.history.last["val_accuracy"] > 0.95, result.history.last


TOKENS = """\
seed: 0
data: {{type: file, path: {path}, features_key: x, labels_key: y}}
model:
  - {{type: Embedding, input_dim: 20, output_dim: 4}}
  - {{type: LSTM, units: 5}}
  - {{type: Linear, units: 2}}
loss: SoftmaxCrossEntropy
optimizer: {{type: Adam, learning_rate: 0.02}}
train: {{epochs: 1, batch_size: 16, validation_split: 0.25}}
"""


def _tokens(tmp_path, name, bad=None):
    x = np.random.default_rng(0).integers(0, 20, (40, 6))
    if bad is not None:
        x[bad] = 25  # past the table of 20 rows
    np.savez(tmp_path / name, x=x, y=(x[:, 0] < 10).astype(np.int64))
    return write(tmp_path / f"{name}.yaml", TOKENS.format(path=tmp_path / name))


def test_a_whole_embedding_lstm_model_is_gradient_checked(tmp_path):
    """dlrun gradcheck CONFIG drew Embedding's indices from its spec's dim name and stopped with
    'input_spec high='D' is not a dim or an option of the layer'."""
    r = run_cli("gradcheck", _tokens(tmp_path, "tok.npz"))
    assert r.code == 0 and "PASS" in r.out.splitlines()[-1], r.out + r.err


def test_an_index_past_the_embedding_is_named_with_its_sample_by_every_command(tmp_path):
    """The layer itself said only 'Embedding: index 25 is outside [0, 20)': no file, no sample."""
    good, bad = _tokens(tmp_path, "tok.npz"), _tokens(tmp_path, "bad.npz", bad=(7, 2))
    want = "sample 8: model[0] Embedding takes indices in [0, 20), got 25; raise input_dim or check the data"
    for args in (["check", bad], ["train", bad, "--runs-dir", tmp_path / "runs"]):
        r = run_cli(*args)
        assert r.code == 2 and r.err.count("\n") == 1 and f"bad.npz: {want}" in r.err, r.err  # sample 8 of the file
    run_dir = tmp_path / "good"
    assert run_cli("train", good, "--runs-dir", run_dir).code == 0
    (run,) = run_dir.iterdir()
    r = run_cli("evaluate", run, "--data", tmp_path / "bad.npz")
    assert r.code == 2 and want in r.err, r.err
    np.save(tmp_path / "bad.npy", np.load(tmp_path / "bad.npz")["x"][:10].astype(np.float64))
    r = run_cli("predict", run, "--input", tmp_path / "bad.npy")
    assert r.code == 2 and f"bad.npy: {want}" in r.err, r.err


def test_regression_targets_of_several_outputs_read_from_an_npz(tmp_path):
    """(N, K) targets (what the adding and sine generators give, saved with numpy) were refused:
    'labels of shape (N, 1); expected (N,)'."""
    x = np.random.default_rng(0).standard_normal((60, 5, 3))
    np.savez(tmp_path / "seq.npz", x=x, y=np.stack([x[:, 0, 0], x[:, -1, 1]], axis=1))
    ds = registry.data.build({"type": "file", "path": str(tmp_path / "seq.npz"), "task": "regression"})
    assert ds.x.shape == (60, 5, 3) and ds.y.shape == (60, 2)
    y = ds.y.copy()
    y[4, 1] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=y)
    with pytest.raises(Exception, match="nan.npz: sample 5: the target is nan"):
        registry.data.build({"type": "file", "path": str(tmp_path / "nan.npz"), "task": "regression"})
    with pytest.raises(Exception, match=r"labels of shape \(60, 2\); expected \(60,\)$"):
        registry.data.build({"type": "file", "path": str(tmp_path / "seq.npz")})
