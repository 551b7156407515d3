"""A plugin's own loss, optimizer, schedule, regularizer, initializer or data generator that
raises or breaks its contract is named (the component, the call, the plugin's file:line) in one
line, by `dlrun check` as by `dlrun train`, instead of an 'internal error' or a numpy error an
epoch later naming something else."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import run_cli, write

PLUGIN = '''\
import numpy as np
from dlrun.layers import Layer
from dlrun.losses import Loss
from dlrun.registry import data, initializers, layers, losses, optimizers, regularizers, schedules


@optimizers.register()
class Typo(optimizers.base):
    """SGD reading an attribute it does not have.

    Args:
        learning_rate: the step size.
    """

    def __init__(self, learning_rate: float = 0.1):
        super().__init__(learning_rate)

    def _update(self, state, p):
        p.data -= self.lr * p.grad


@optimizers.register()
class DictMomentum(optimizers.base):
    """Momentum kept in a plain dict, which checkpoints do not save.

    Args:
        learning_rate: the step size.
    """

    def __init__(self, learning_rate: float = 0.1):
        super().__init__(learning_rate)
        self.velocity = {}

    def _update(self, state, p):
        v = self.velocity.setdefault(id(p), np.zeros_like(p.data))
        v *= 0.9
        v -= self.learning_rate * p.grad
        p.data += v


@losses.register()
class PerSample(Loss):
    """Cross-entropy without the mean."""

    def forward(self, z, y):
        self.z, self.y = z, y
        return -z[np.arange(len(y)), y]

    def backward(self):
        return np.zeros_like(self.z)


@losses.register()
class Float64Grad(Loss):
    """Mean of the target scores, with a float64 gradient (np.eye)."""

    def forward(self, z, y):
        self.z, self.y = z, y
        return -z[np.arange(len(y)), y].mean()

    def backward(self):
        return -np.eye(self.z.shape[1])[self.y] / len(self.y)


@losses.register()
class Raises(Loss):
    """Indexes past the last class."""

    def forward(self, z, y):
        return z[np.arange(len(y)), y + 10].mean()

    def backward(self):
        return None


@regularizers.register()
class RowPenalty(regularizers.base):
    """A penalty per row instead of a sum.

    Args:
        strength: the factor.
    """

    def __init__(self, strength: float = 0.01):
        self.strength = strength

    def penalty(self, w):
        return self.strength * (w ** 2).sum(axis=-1)

    def add_gradient(self, w, grad):
        grad += 2 * self.strength * w


@schedules.register("falling")
class Falling(schedules.base):
    """Falls below zero after epoch 2."""

    def value(self, epoch):
        return self.base_lr * (1 - epoch / 2)


@schedules.register("falling_steps")
class FallingSteps(schedules.base):
    """Falls below zero inside epoch 3, step by step."""

    def at(self, u, delta):
        return self.base_lr * (1 - u / 2)


@schedules.register("broken")
class Broken(schedules.base):
    """Reads an attribute it does not have."""

    def value(self, epoch):
        return self.base_lr * self.gamma ** epoch


@initializers.register("bad_normal")
class BadNormal(initializers.base):
    """Calls the generator with a wrong keyword."""

    def __call__(self, shape, fan_in, fan_out, rng):
        return rng.normal(0, 1, shape=shape)


@data.register("pairs")
def pairs(samples: int = 40):
    """Returns a tuple instead of a Dataset."""
    x = np.random.default_rng(0).standard_normal((samples, 2))
    return missing_name, x


@data.register("tuple_data")
def tuple_data(samples: int = 40):
    """Returns (x, y), not a Dataset."""
    x = np.random.default_rng(0).standard_normal((samples, 2))
    return x, (x[:, 0] > 0).astype(np.int64)


@data.register("short_labels")
def short_labels(samples: int = 40):
    """One label too few."""
    from dlrun.data import Dataset

    x = np.random.default_rng(0).standard_normal((samples, 2))
    return Dataset(x, (x[:, 0] > 0).astype(np.int64)[:-1], name="short")


@layers.register()
class Shrink(Layer):
    """Drops k - 1 features (a valid-padding 1-D window).

    Args:
        k: the window.
    """

    def __init__(self, k: int = 2):
        self.k = k

    def build(self, input_shape):
        return (input_shape[0] - self.k + 1,)

    def forward(self, x, y=None):
        return x[:, self.k - 1:]

    def backward(self, dy):
        return dy


@layers.register()
class WidthOnly(Layer):
    """Returns an int from build."""

    def build(self, input_shape):
        return input_shape[0]

    def forward(self, x, y=None):
        return x

    def backward(self, dy):
        return dy
'''

BASE = {"plugins": "[plug.py]", "data": "{type: spiral, points_per_class: 20}",
        "model": "[{type: Linear, units: 6}, ReLU, {type: Linear, units: 3}]",
        "loss": "SoftmaxCrossEntropy", "optimizer": "{type: SGD, learning_rate: 0.1}",
        "train": "{epochs: 3, batch_size: 20}"}


def _config(tmp_path, **changes):
    write(tmp_path / "plug.py", PLUGIN)
    text = "".join(f"{k}: {v}\n" for k, v in {**BASE, **changes}.items() if v is not None)
    return write(tmp_path / "c.yaml", text)


CASES = [
    ({"optimizer": "{type: Typo}"}, 1,
     r"the optimizer 'Typo': _update raised AttributeError: 'Typo' object has no attribute 'lr' \(plug\.py:19\)"),
    ({"loss": "Raises"}, 1, r"the loss 'Raises': forward raised IndexError: .* \(plug\.py:\d+\)"),
    ({"train": "{epochs: 3, schedule: broken}"}, 1,
     r"the schedule 'broken': value raised AttributeError: 'Broken' object has no attribute 'gamma'"),
    ({"data": "pairs"}, 1, r"plugin code \(pairs\) raised NameError: name 'missing_name' is not defined \(plug\.py:\d+\)"),
    ({"data": "tuple_data"}, 2, r"c\.yaml:2: data: the data generator 'tuple_data' returned tuple; expected a "
                                r"dlrun\.data\.Dataset\(x, y\)"),
    ({"data": "short_labels"}, 2, r"data 'short': 40 samples but 39 labels"),
    ({"model": "[{type: Linear, units: 3, weight_initializer: bad_normal}]"}, 1,
     r"c\.yaml:3: model\[0\]: the initializer 'bad_normal': __call__ raised TypeError: .*shape.* \(plug\.py:\d+\)"),
    ({"loss": "PerSample"}, 2, r"the loss PerSample\(\): forward returned shape \(20,\) float32; expected a scalar"),
    ({"loss": "Float64Grad"}, 2,
     r"the loss Float64Grad\(\): backward returned dL/dz as shape \(20, 3\) float64; expected shape \(20, 3\) float32"),
    ({"regularizer": "RowPenalty"}, 2, r"the regularizer RowPenalty\(strength=0\.01\): penalty returned .*expected a scalar"),
    ({"optimizer": "{type: DictMomentum}"}, 2,
     r"the optimizer DictMomentum\(\) changed self\.velocity in its first step; .*slots = \('velocity',\)"),
    ({"model": "[{type: Linear, units: 4}, {type: Shrink, k: 6}, {type: Linear, units: 3}]"}, 2,
     r"c\.yaml:3: model\[1\]: Shrink: build returned the output shape \(-1,\) for input of shape \(4,\); every size "
     r"must be an integer >= 1"),
    ({"model": "[{type: Linear, units: 4}, WidthOnly, {type: Linear, units: 3}]"}, 2,
     r"model\[1\]: WidthOnly: build returned 4 \(int\); it must return the per-sample output shape as a tuple"),
]


@pytest.mark.parametrize("changes,code,message", CASES, ids=[
    "optimizer-raises", "loss-raises", "schedule-raises", "data-raises", "data-tuple", "data-lengths",
    "initializer-raises", "loss-per-sample",
    "loss-float64-grad", "penalty-per-row", "optimizer-state-outside-slots", "build-negative", "build-int"])
@pytest.mark.parametrize("command", ["check", "train"])
def test_a_plugin_that_raises_or_breaks_its_contract_is_named(tmp_path, changes, code, message, command):
    cfg = _config(tmp_path, **changes)
    args = (command, cfg) + (("--runs-dir", tmp_path / "runs") if command == "train" else ())
    r = run_cli(*args)
    assert r.code == code, r.err
    assert re.search(message, r.err), r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing half-written


def test_a_schedule_giving_a_negative_rate_stops_training(tmp_path):
    cfg = _config(tmp_path, train="{epochs: 5, batch_size: 20, schedule: falling}")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 2, r.err
    assert "the schedule falling() gave the learning rate -0.05 for epoch 3; a rate must be a finite number >= 0" in r.err
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--set", "train.schedule_interval=step",
                "--set", "train.schedule=falling_steps")
    assert r.code == 2, r.err
    assert "the schedule falling_steps() gave the learning rate -0.01666666666666667" in r.err and "for step 2 of epoch 3" in r.err


NEEDS_LABELS = '''\
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Tagged(Layer):
    """Identity."""

    needs_labels = NEEDS

    def forward(SIGNATURE):
        return x

    def backward(self, dy):
        return dy
'''


@pytest.mark.parametrize("needs,signature,message", [
    (True, "self, x", "needs_labels = True, so the model calls forward(x, y), but forward takes no labels"),
    (False, "self, x, y", "forward requires 'y', but the model calls forward(x) alone unless the class sets "
                          "needs_labels = True"),
])
def test_a_forward_that_cannot_take_the_models_call_is_refused_when_the_plugin_loads(tmp_path, needs, signature,
                                                                                      message):
    write(tmp_path / "tag.py", NEEDS_LABELS.replace("NEEDS", str(needs)).replace("SIGNATURE", signature))
    r = run_cli("gradcheck", "Tagged", "--plugin", tmp_path / "tag.py")
    assert r.code == 2 and message in r.err and "tag.py:5" in r.err, r.err
    for ok in ("self, x, y=None", "self, x, *rest") if not needs else ("self, x, y", "self, x, y=None"):
        write(tmp_path / "ok.py", NEEDS_LABELS.replace("NEEDS", str(needs)).replace("SIGNATURE", ok)
              .replace("Tagged", "Fine"))
        r = run_cli("list", "layers", "--plugin", tmp_path / "ok.py")
        assert r.code == 0, (ok, r.err)


def test_a_plugin_that_fails_to_load_is_the_only_error_for_the_names_it_would_define(tmp_path):
    cfg = _config(tmp_path, plugins="[plug_typo.py]", optimizer="{type: DictMomentum}", loss="PerSample",
                  model="[{type: Linear, units: 3}, WidthOnly]")
    r = run_cli("check", cfg)
    assert r.code == 2, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "plugin file not found" in lines[0], r.err
    assert "(so these names were not checked: PerSample, DictMomentum, WidthOnly)" in lines[0], r.err


SCALE = '''\
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Twice(Layer):
    """y = 2x."""

    def forward(self, x, y=None):
        return 2 * x

    def backward(self, dy):
        return 2 * dy
'''


def test_a_moved_plugin_is_named_with_plugin_on_predict_evaluate_and_resume(tmp_path):
    """The run records the plugin's absolute path; after the file moved, predict, evaluate and
    --resume said 'put it back at that path' and predict/evaluate took no --plugin."""
    write(tmp_path / "old" / "twice.py", SCALE)
    cfg = write(tmp_path / "c.yaml", "seed: 0\nplugins: [old/twice.py]\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Linear, units: 6}, Twice, {type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"
                                     "train: {epochs: 2, batch_size: 20}\n")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    run = r.out.strip().splitlines()[-1]
    write(tmp_path / "x.csv", "0.1,0.2\n-0.3,0.4\n")
    (tmp_path / "old" / "twice.py").rename(tmp_path / "twice_moved.py")
    r = run_cli("predict", run, "--input", tmp_path / "x.csv")
    assert r.code == 2 and "that file is missing; put it back, or name its new place with --plugin FILE.py" in r.err
    moved = tmp_path / "twice_moved.py"
    r = run_cli("predict", run, "--input", tmp_path / "x.csv", "--plugin", moved)
    assert r.code == 0 and len(r.out.strip().splitlines()) == 3, r.err
    assert f"is gone; using {moved}, which defines Twice" in r.err
    r = run_cli("evaluate", run, "--data", "spiral", "--plugin", moved)
    assert r.code == 0 and "accuracy" in r.out, r.err
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--plugin", moved)
    assert r.code == 0, r.err
    assert f"is gone; using {moved}, which defines Twice" in r.err  # (was silent on --resume)
    r = run_cli("predict", f"{run}/checkpoints/last.npz", "--input", tmp_path / "x.csv")  # it records the new place
    assert r.code == 2 and f"add --plugin {moved}" in r.err, r.err
    r = run_cli("predict", f"{run}/checkpoints/last.npz", "--input", tmp_path / "x.csv", "--plugin", moved)
    assert r.code == 0 and "is gone" not in r.err and "warning" not in r.err, r.err
    # --plugin while the recorded file still exists: the given file is used (was: 'already registered')
    write(tmp_path / "copy" / "twice.py", SCALE)
    r = run_cli("evaluate", run, "--data", "spiral", "--plugin", tmp_path / "copy" / "twice.py")
    assert r.code == 0, r.err
    assert f"using {tmp_path / 'copy' / 'twice.py'} (given with --plugin) instead of the recorded plugin {moved}" in r.err


def test_rough_edges_a_newcomer_met(tmp_path):
    regression = _config(tmp_path, data="{type: sine}", model="[{type: Linear, units: 1}]", loss="Undocumented")
    write(tmp_path / "plug.py", PLUGIN + '''

@losses.register()
class Undocumented(Loss):
    def forward(self, z, y):
        return 0.0

    def backward(self):
        return None
''')
    plug = tmp_path / "plug.py"
    r = run_cli("gradcheck", "Typo", "--plugin", plug)  # an optimizer has no backward to check
    assert r.code == 2 and "'Typo' is an optimizer, which has no backward pass to check" in r.err, r.err
    r = run_cli("gradcheck", "Shrink", "--plugin", plug, "--set", "k=4", "--dims", "N=3,D=2")  # an empty output
    assert r.code == 2, r.out + r.err
    assert "Shrink: build returned the output shape (-1,)" in r.out and "choose --dims" in r.out, r.out
    r = run_cli("gradcheck", "WidthOnly", "--plugin", plug)  # a bug in build: no --dims hint
    assert r.code == 2 and "WidthOnly: build returned 3 (int)" in r.out and "--dims" not in r.out, r.out
    r = run_cli("show", "Undocumented", "--plugin", plug)  # not the base class's "Base class for losses."
    assert r.code == 0 and "Base class" not in r.out, r.out
    r = run_cli("check", regression)
    assert r.code == 2 and 'a loss of your own for regression sets task = "regression"' in r.err, r.err
    r = run_cli("time", regression, "--set", "loss=MSE", "--set", "optimizer.learning_rate=1.0e+30", "--batches", "3")
    assert r.code == 0 and "RuntimeWarning" not in r.err, r.err
    assert "the loss became NaN or inf during these steps" in r.out, r.out


def test_gradcheck_of_a_config_checks_its_regularizer_and_names_the_line_a_layer_raised_at(tmp_path):
    cfg = _config(tmp_path, regularizer="RowPenalty")  # a penalty that is not a scalar
    r = run_cli("gradcheck", cfg)
    assert r.code in (1, 2) and "regularizer RowPenalty" in r.out, r.out + r.err
    write(tmp_path / "raiser.py", '''\
import numpy as np
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class BadBack(Layer):
    """y = x."""

    def forward(self, x, y=None):
        return x

    def backward(self, dy):
        return dy + np.ones(dy.shape[1] + 1)
''')
    r = run_cli("gradcheck", "BadBack", "--plugin", tmp_path / "raiser.py")
    assert r.code == 2 and "backward raised ValueError" in r.out and "(raiser.py:14)" in r.out, r.out


def test_gradcheck_of_a_loss_runs_it_once_in_float32(tmp_path):
    """A loss whose backward returns float64 (np.eye(C)[y]) passed gradcheck; training refuses it."""
    write(tmp_path / "plug.py", PLUGIN)
    r = run_cli("gradcheck", "Float64Grad", "--plugin", tmp_path / "plug.py")
    assert r.code == 1, r.out + r.err
    assert re.search(r"aux float32 +FAIL +with float32 scores .* backward returns dz as float64", r.out), r.out
    r = run_cli("gradcheck", "SoftmaxCrossEntropy")
    assert r.code == 0 and re.search(r"aux float32 +PASS", r.out), r.out


ACCEPTED = '''\
import math

import numpy as np
from dlrun.layers import Layer
from dlrun.registry import layers, optimizers


@layers.register()
class Halve(Layer):
    """Keeps every second feature; build returns an integer array, not a tuple."""

    def build(self, input_shape):
        return np.array(input_shape) // 2

    def forward(self, x):
        return x[:, ::2] * 1.0

    def backward(self, dy):
        dx = np.zeros((len(dy), 2 * dy.shape[1]), dy.dtype)
        dx[:, ::2] = dy
        return dx


def _size(n, k):
    return np.empty(n - k + 1).size  # raises for n < k: the layer's own helper


@layers.register()
class Window(Layer):
    """Sums windows of k features."""

    def __init__(self, k: int = 3):
        self.k = k

    def build(self, input_shape):
        return (_size(input_shape[0], self.k),)

    def forward(self, x):
        return np.stack([x[:, i:i + self.k].sum(1) for i in range(x.shape[1] - self.k + 1)], 1)

    def backward(self, dy):
        return dy


@optimizers.register()
class NanOption(optimizers.base):
    """SGD with a clip option left at NaN for 'off'.

    Args:
        learning_rate: the step size.
    """

    def __init__(self, learning_rate: float = 0.1):
        super().__init__(learning_rate)
        self.clip = math.nan

    def _update(self, state, p):
        p.data -= self.learning_rate * p.grad


@optimizers.register()
class FlatSGD(optimizers.base):
    """SGD on the flat parameter buffer, kept as self.weights and self.gradients.

    Args:
        learning_rate: the step size.
    """

    def __init__(self, learning_rate: float = 0.1):
        super().__init__(learning_rate)

    def setup(self, named_params, arena=None):
        super().setup(named_params, arena)
        self.weights, self.gradients = arena.data, arena.grad

    def step(self):
        self.iterations += 1
        self.weights -= self.learning_rate * self.gradients
'''


@pytest.mark.parametrize("model,optimizer", [
    ("[{type: Linear, units: 4}, Halve, {type: Linear, units: 3}]", "SGD"),
    ("[{type: Linear, units: 3}]", "NanOption"),
    ("[{type: Linear, units: 3}]", "FlatSGD"),
], ids=["build-returns-an-array", "optimizer-option-nan", "optimizer-views-the-flat-buffer"])
def test_correct_plugins_pass_the_first_call_checks(tmp_path, model, optimizer):
    """Refused by stop 19's checks although correct: a build returning np.array(...) // 2, an
    optimizer attribute left at NaN (NaN != NaN read as 'changed'), an optimizer holding views of
    the flat parameter buffer (the parameters, which checkpoints hold)."""
    write(tmp_path / "ok.py", ACCEPTED)
    cfg = write(tmp_path / "c.yaml", f"plugins: [ok.py]\ndata: {{type: spiral, points_per_class: 20}}\nmodel: {model}\n"
                                     f"loss: SoftmaxCrossEntropy\noptimizer: {optimizer}\ntrain: {{epochs: 2}}\n")
    r = run_cli("check", cfg)
    assert r.code == 0, r.err
    assert run_cli("train", cfg, "--runs-dir", tmp_path / "runs").code == 0


def test_a_helper_in_the_layers_own_file_raising_in_build_is_the_layers_shape_error(tmp_path):
    write(tmp_path / "ok.py", ACCEPTED)
    cfg = write(tmp_path / "c.yaml", "plugins: [ok.py]\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Window, k: 4}]\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n")
    r = run_cli("check", cfg)
    assert r.code == 2 and "model[0]: Window cannot take input of shape (2,): negative dimensions" in r.err, r.err


def test_show_of_a_subclass_without_a_docstring_keeps_its_options_descriptions(tmp_path):
    """Stop 19 stopped showing a base class's docstring for a plugin without one, and with it
    the inherited options' descriptions; those come from the class that defines __init__."""
    plug = write(tmp_path / "sub.py", "from dlrun.layers.linear import Linear\nfrom dlrun.registry import layers\n\n\n"
                                      "@layers.register()\nclass MyLinear(Linear):\n    pass\n")
    r = run_cli("show", "MyLinear", "--plugin", plug)
    assert r.code == 0 and "number of output" in r.out and "features." in r.out, r.out
    assert "y = x Wᵀ + b" not in r.out  # Linear's own summary is not MyLinear's


def test_a_resume_with_a_relative_plugin_records_its_absolute_path(tmp_path):
    """--resume --plugin moved/twice.py (relative to the working directory) wrote
    'plugins: [moved/twice.py]' into config.yaml and the checkpoint's config: `dlrun train
    RUN/config.yaml` then looked for RUN/moved/twice.py, and a copied checkpoint refused
    --plugin ../moved/twice.py, saying 'moved/twice.py ... is missing'."""
    write(tmp_path / "twice.py", SCALE)
    cfg = write(tmp_path / "c.yaml", "seed: 0\nplugins: [twice.py]\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Linear, units: 6}, Twice, {type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"
                                     "train: {epochs: 2, batch_size: 20}\n")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    run = Path(r.out.strip().splitlines()[-1])
    (tmp_path / "moved").mkdir()
    (tmp_path / "twice.py").rename(tmp_path / "moved" / "twice.py")
    r = run_cli("train", "--resume", run, "--set", "train.epochs=3", "--plugin", "moved/twice.py", cwd=tmp_path)
    assert r.code == 0, r.err
    moved = str(tmp_path / "moved" / "twice.py")
    assert f"plugins: [{moved}]" in (run / "config.yaml").read_text()
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(run / "checkpoints" / "last.npz", tmp_path / "elsewhere" / "model.npz")
    write(tmp_path / "x.csv", "0.1,0.2\n-0.3,0.4\n")
    r = run_cli("predict", "model.npz", "--input", "../x.csv", "--plugin", "../moved/twice.py",
                cwd=tmp_path / "elsewhere")
    assert r.code == 0 and len(r.out.strip().splitlines()) == 3, r.err
    r = run_cli("train", run / "config.yaml", "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
