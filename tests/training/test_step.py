"""The one training step: its fast path and its observed path are the same step, observers see
every part in order, and the trainer's state round-trips through state_dict."""
from __future__ import annotations

import numpy as np

from dlrun import registry
from dlrun.model import Sequential
from dlrun.training.step import StepObserver
from dlrun.training.trainer import Trainer


def _trainer(seed=0, accumulate=1):
    layers = [registry.layers.build(s) for s in ({"type": "Linear", "units": 8}, "ReLU", {"type": "Dropout", "rate": 0.3},
                                                 {"type": "Linear", "units": 3})]
    model = Sequential(layers, (4,), dtype=np.float64, seed=seed)
    opt = registry.optimizers.build({"type": "Adam", "learning_rate": 0.01})
    reg = registry.regularizers.build({"type": "L2", "strength": 1e-3})
    return Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), opt, reg, batch_size=5, accumulate=accumulate)


def _batches():
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((5, 4)), rng.integers(0, 3, 5)) for _ in range(4)]


class Recorder(StepObserver):
    def __init__(self):
        self.calls = []

    def begin(self, xb, yb):
        self.calls.append("begin")

    def forward(self, k, layer, out):
        self.calls.append(f"forward {k}")

    def loss(self, value, out, y):
        self.calls.append("loss")

    def loss_backward(self, dy, out):
        self.calls.append("loss_backward")

    def backward(self, k, layer, dx):
        self.calls.append(f"backward {k}")

    def regularizer(self, p, reg):
        self.calls.append("regularizer")

    def update(self, optimizer):
        self.calls.append("update")

    def updated(self, optimizer):
        self.calls.append("updated")

    def end(self):
        self.calls.append("end")


def test_the_observed_step_is_the_fast_step_bit_for_bit():
    plain, watched = _trainer(), _trainer()
    recorder = Recorder()
    watched.training_step.observers.append(recorder)
    for t in (plain, watched):
        t.fast_mode(True)
        for xb, yb in _batches():
            t.train_step(xb, yb)
    for (n, p), (_, q) in zip(plain.model.named_parameters(), watched.model.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    assert plain.step == watched.step == 4
    # fast mode: backward stops at the first trainable layer (position 0 here: all of it runs)
    assert recorder.calls[:14] == ["begin", "forward 0", "forward 1", "forward 2", "forward 3", "loss",
                                   "loss_backward", "backward 3", "backward 2", "backward 1", "backward 0",
                                   "regularizer", "regularizer", "update"]
    assert recorder.calls.count("end") == 4


def test_an_accumulating_step_updates_after_its_window_only():
    t = _trainer(accumulate=2)
    recorder = Recorder()
    t.training_step.observers.append(recorder)
    (x1, y1), (x2, y2) = _batches()[:2]
    t.training_step(x1, y1, window=(0.5, True, False))
    assert "update" not in recorder.calls and t.step == 0
    t.training_step(x2, y2, window=(0.5, False, True))
    assert recorder.calls.count("update") == 1 and t.step == 1


def test_the_trainer_state_round_trips():
    a = _trainer()
    a.fast_mode(True)
    for xb, yb in _batches()[:2]:
        a.train_step(xb, yb)
    a.epoch = 1
    state = a.state_dict()
    b = _trainer(seed=5)
    b.model.load_state_arrays(a.model.state_arrays())
    b.load_state_dict({**state, "optimizer": {k: np.array(v) for k, v in state["optimizer"].items()}})
    assert (b.epoch, b.step, b.optimizer.iterations) == (1, 2, 2)
    assert b.shuffle_rng.bit_generator.state == a.shuffle_rng.bit_generator.state
    b.fast_mode(True)
    for t in (a, b):
        t.model.layers[2].rng = np.random.default_rng(9)  # the same dropout draws on both
        for xb, yb in _batches()[2:]:
            t.train_step(xb, yb)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert np.array_equal(p.data, q.data), n


def test_per_batch_hooks_reach_every_callback_that_does_something_in_them():
    from dlrun.training.hooks import Callback, listening

    calls = []

    class Counts(Callback):  # overrides both per-batch hooks
        def on_after_backward(self, trainer):
            calls.append("after_backward")

        def on_batch_end(self, epoch, batch):
            calls.append(f"batch_end {epoch}.{batch}")

    class Quiet(Callback):  # the base class's hooks only
        pass

    class Duck:  # not a Callback: every hook its own
        def __getattr__(self, name):
            return lambda *a: calls.append(f"duck {name}") if name in ("on_batch_end", "on_after_backward") else None

    assigned = Quiet()
    assigned.on_batch_end = lambda epoch, batch: calls.append("assigned")  # set on the instance
    quiet, counts, duck = Quiet(), Counts(), Duck()
    assert listening([quiet, counts, duck, assigned], "on_batch_end") == [counts, duck, assigned]
    assert listening([quiet, counts, duck, assigned], "on_after_backward") == [counts, duck]
    (x, y), t = _batches()[0], _trainer()
    t.fit(np.concatenate([x, x]), np.concatenate([y, y]), epochs=1, callbacks=[quiet, counts, duck, assigned])
    assert calls == [c for b in (1, 2) for c in ("after_backward", "duck on_after_backward", f"batch_end 1.{b}",
                                                  "duck on_batch_end", "assigned")]
