"""A model's first forward and backward check what each layer returns (shape, dtype, device), so
a plugin that breaks the contract is named, not reported by the layer after it."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import write
from dlrun import registry
from dlrun.backend import CPU
from dlrun.errors import LayerContractError
from dlrun.layers import Layer
from dlrun.model import Sequential


class Wrong(Layer):
    """Identity whose forward or backward breaks one rule (``how``)."""

    def __init__(self, how: str = "none"):
        self.how = how

    def forward(self, x, y=None):
        return x.astype(np.float64) if self.how == "forward-dtype" else x * 1

    def backward(self, dy):
        if self.how == "backward-shape":
            return dy[:, :-1]
        if self.how == "backward-none":
            return None
        return dy.astype(np.float64) if self.how == "backward-dtype" else dy


def _model(how):
    linear = registry.layers.build({"type": "Linear", "units": 4})
    return Sequential([linear, Wrong(how), registry.layers.build({"type": "Linear", "units": 2})], (3,), CPU,
                      np.float32, seed=0)


@pytest.mark.parametrize("how, message", [
    ("forward-dtype", "model[1] Wrong(): forward returned its output as shape (5, 4) float64; expected shape (5, 4) float32"),
    ("backward-dtype", "model[1] Wrong(): backward returned dx as shape (5, 4) float64; expected shape (5, 4) float32"),
    ("backward-shape", "model[1] Wrong(): backward returned dx as shape (5, 3) float32; expected shape (5, 4) float32"),
    ("backward-none", "model[1] Wrong(): backward returned dx as None; expected shape (5, 4) float32 on cpu (a "
                      "missing return statement?)"),
])
def test_the_first_pass_names_a_layer_that_breaks_the_contract(how, message):
    model = _model(how)
    x = np.ones((5, 3), np.float32)
    with pytest.raises(LayerContractError) as e:
        model.forward(x)
        model.backward(np.ones((5, 2), np.float32))
    assert str(e.value).startswith(message), str(e.value)


class Scaled(Layer):
    """y = x ⊙ w, w of shape (D,); its backward writes w.grad in one of several (mostly wrong) ways."""

    def __init__(self, how: str = "write"):
        self.how = how

    def build(self, input_shape):
        self.w = self.add_param("w", input_shape, value=np.ones(input_shape))
        return input_shape

    def forward(self, x, y=None):
        self._x = x
        return x * self.w.data

    def backward(self, dy):
        g = (dy * self._x).sum(axis=0)
        if self.how == "write":
            self.w.grad[...] = g
        elif self.how == "accumulate":  # the seed NumPy library's style: the optimizer zeroes grads
            self.w.grad += g
        elif self.how == "partial":
            self.w.grad[:-1] = g[:-1]
        elif self.how == "wrong-shape":
            self.w.grad = dy * self._x
        return dy * self.w.data


@pytest.mark.parametrize("how, message", [
    ("accumulate", "model[1] Scaled(): backward did not write every element of w.grad; it must set the whole "
                   "gradient of this batch (p.grad[...] = ..., not p.grad += ..."),
    ("partial", "model[1] Scaled(): backward did not write every element of w.grad"),
    ("none", "model[1] Scaled(): backward did not write every element of w.grad"),
    ("wrong-shape", "model[1] Scaled(): backward left w.grad as shape (5, 4) float32; expected shape (4,) float32"),
])
def test_the_first_backward_checks_each_parameter_gradient_was_written_whole(how, message):
    """A backward that adds into p.grad (never zeroed between steps) or skips it trained silently
    wrong; a gradient of the wrong shape failed inside the optimizer, naming no layer."""
    linear = registry.layers.build({"type": "Linear", "units": 4})
    model = Sequential([linear, Scaled(how), registry.layers.build({"type": "Linear", "units": 2})], (3,), CPU,
                       np.float32, seed=0)
    model.forward(np.ones((5, 3), np.float32))
    with pytest.raises(LayerContractError) as e:
        model.backward(np.ones((5, 2), np.float32))
    assert str(e.value).startswith(message), str(e.value)


def test_a_layer_that_writes_its_gradients_passes_the_gradient_check():
    model = Sequential([Scaled("write"), registry.layers.build({"type": "Linear", "units": 2})], (3,), CPU,
                       np.float32, seed=0)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    model.forward(x)
    model.backward(np.ones((5, 2), np.float32))
    assert np.isfinite(model.layers[0].w.grad).all()


def test_checks_run_once_and_correct_layers_pass():
    model = _model("none")
    x = np.ones((5, 3), np.float32)
    for _ in range(2):
        out = model.forward(x)
        assert model.backward(np.ones_like(out)).shape == (5, 3)
    assert not model._unchecked_forward and not model._unchecked_backward
    # a caller's float64 input may give float64 outputs: the input's dtype is accepted too
    assert Sequential([Wrong()], (3,), CPU, np.float32).forward(np.ones((2, 3))).dtype == np.float64


def test_train_reports_a_broken_plugin_in_one_line(cli, tmp_path):
    write(tmp_path / "bad.py", "import numpy as np\nfrom dlrun.layers import Layer\nfrom dlrun.registry import layers\n\n\n"
          "@layers.register()\nclass Doubler(Layer):\n    def forward(self, x, y=None):\n"
          "        return (2 * x).astype(np.float64)\n\n    def backward(self, dy):\n        return 2 * dy\n")
    cfg = write(tmp_path / "c.yaml", "plugins: [bad.py]\ndata: {type: spiral, classes: 2, points_per_class: 10}\n"
                "model: [{type: Linear, units: 4}, Doubler, {type: Linear, units: 2}]\n"
                "loss: SoftmaxCrossEntropy\noptimizer: SGD\ntrain: {epochs: 1}\n")
    r = cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "model[1] Doubler(): forward returned its output as shape (" in r.err and "float64; expected" in r.err


class Transposed(Layer):
    """y = x Wᵀ with a square-free W (4, 3); backward assigns or rebinds the transposed gradient."""

    def __init__(self, how: str = "rebind"):
        self.how = how

    def build(self, input_shape):
        self.w = self.add_param("w", (4, input_shape[0]), "xavier_uniform")
        return (4,)

    def forward(self, x, y=None):
        self._x = x
        return x @ self.w.data.T

    def backward(self, dy):
        if self.how == "rebind":
            self.w.grad = self._x.T @ dy
        else:
            self.w.grad[...] = self._x.T @ dy
        return dy @ self.w.data


@pytest.mark.parametrize("how, message", [
    ("rebind", "backward left w.grad as shape (3, 4) float32; expected shape (4, 3) float32 on cpu "),
    ("assign", "backward raised ValueError: could not broadcast input array from shape (3,4) into shape (4,3) "),
])
def test_a_transposed_gradient_is_pointed_out_in_training(how, message):
    model = Sequential([Transposed(how)], (3,), CPU, np.float32, seed=0)
    model.forward(np.ones((5, 3), np.float32))
    with pytest.raises(Exception) as e:
        model.backward(np.ones((5, 4), np.float32))
    text = str(e.value)
    assert message in text and "transpose" in text.split(message)[1], text



class Projection(Layer):
    """y = x Pᵀ with a fixed matrix P (4, D): drawn from numpy's global generator and kept as a plain
    attribute (neon style), kept as a non-trainable parameter, or a deterministic constant."""

    def __init__(self, how: str = "loose"):
        self.how = how

    def build(self, input_shape):
        shape = (4, input_shape[0])
        if self.how == "loose":
            self.P = np.random.randn(*shape)
        elif self.how == "param":
            self.P = self.add_param("P", shape, value=np.random.randn(*shape), trainable=False).data
        else:
            self.P = np.ones(shape)  # the same in every process: nothing is lost
        return (4,)

    def forward(self, x, y=None):
        return x @ self.P.T.astype(x.dtype)

    def backward(self, dy):
        return dy @ self.P.astype(dy.dtype)


def test_an_unsaved_random_array_drawn_in_build_is_refused():
    # it trained, then `dlrun evaluate` drew another matrix on every call (two calls: accuracy 0.36, 0.45)
    with pytest.raises(LayerContractError) as e:
        Sequential([Projection("loose")], (3,), CPU, np.float32, seed=0)
    assert e.value.where.path == "model[0]"
    assert "build drew P (4, 3) from numpy's global random generator" in e.value.message
    assert "not saved in checkpoints" in e.value.message
    for how in ("param", "constant"):  # saved as a parameter, or rebuilt the same: accepted
        Sequential([Projection(how)], (3,), CPU, np.float32, seed=0)
