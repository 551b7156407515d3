"""Gradient clipping against hand computation; early stopping on scripted metric sequences,
through Trainer.fit; the controls built from a config."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU
from dlrun.training.controls import EarlyStopping, GradientClipping, LearningRateScheduler, from_config
from dlrun.config import config_from_dict
from dlrun.errors import ConfigError
from dlrun.data.generators import blobs
from dlrun.layers.base import Parameter
from dlrun.model import Sequential
from dlrun.training.hooks import Callback, Event
from dlrun.training.trainer import Trainer


class FakeTrainer:
    def __init__(self, grads, dtype=np.float64):
        self.params = [Parameter(np.zeros(len(g), dtype), np.array(g, dtype)) for g in grads]
        self.optimizer = type("O", (), {"params": [(str(i), p) for i, p in enumerate(self.params)]})()
        self.backend = CPU


def clip(grads, **kw):
    t = FakeTrainer(grads)
    cb = GradientClipping(**kw)
    cb.on_train_begin(t)
    cb.on_after_backward(t)
    return [p.grad for p in t.params], cb


def test_clip_by_global_norm():
    # ‖(3, 4, 12)‖ = 13 over both parameters together; clip to 6.5 halves every entry
    (a, b), cb = clip([[3.0, 4.0], [12.0]], clip_norm=6.5)
    s = 6.5 / (13.0 + 1e-6)
    np.testing.assert_allclose(a, [3 * s, 4 * s], rtol=1e-15)
    np.testing.assert_allclose(b, [12 * s], rtol=1e-15)
    assert float(cb.last_norm) == pytest.approx(13.0)
    assert np.sqrt((a ** 2).sum() + (b ** 2).sum()) == pytest.approx(6.5, rel=1e-6)


def test_norm_below_the_threshold_leaves_gradients_untouched():
    (a, b), _ = clip([[3.0, 4.0], [12.0]], clip_norm=13.5)
    assert a.tolist() == [3.0, 4.0] and b.tolist() == [12.0]


def test_clip_by_value_then_by_norm():
    (a,), _ = clip([[-5.0, 0.5, 2.0]], clip_value=1.0)
    assert a.tolist() == [-1.0, 0.5, 1.0]
    # value first: (-1, 0.5, 1) has norm 1.5; then norm 0.75 halves it
    (a,), _ = clip([[-5.0, 0.5, 2.0]], clip_value=1.0, clip_norm=0.75)
    np.testing.assert_allclose(a, np.array([-1.0, 0.5, 1.0]) * 0.75 / (1.5 + 1e-6), rtol=1e-15)


def test_clipping_keeps_float32_in_place():
    t = FakeTrainer([[30.0, 40.0]], np.float32)
    g = t.params[0].grad
    cb = GradientClipping(clip_norm=5.0)
    cb.on_train_begin(t)
    cb.on_after_backward(t)
    assert t.params[0].grad is g and g.dtype == np.float32
    np.testing.assert_allclose(g, [3.0, 4.0], rtol=1e-6)


# -- early stopping through the real training loop, with a scripted metric ---------------------
class Script(Callback):
    """Overwrites the monitored metric with scripted values and records the weights."""

    def __init__(self, key, values):
        self.key, self.values, self.weights = key, values, {}

    def on_train_begin(self, trainer):
        self.model = trainer.model

    def on_epoch_end(self, epoch, metrics):
        metrics[self.key] = self.values[epoch - 1]
        self.weights[epoch] = {k: v.copy() for k, v in self.model.state_arrays().items()}


def fit(values, key="val_loss", epochs=20, **es):
    ds = blobs(samples=60, classes=3, seed=1)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 3})], (2,), seed=0)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"),
                      batch_size=20, seed=0)
    script, stop = Script(key, values), EarlyStopping(monitor=key, **es)
    history = trainer.fit(ds.x, ds.y, ds.x[:9], ds.y[:9], epochs=epochs, callbacks=[script, stop])
    return trainer, stop, script, history


def test_stops_after_patience_epochs_without_improvement():
    values = [1.0, 0.8, 0.7, 0.75, 0.71, 0.69, 0.70, 0.69, 0.71, 0.9] + [0.1] * 10
    trainer, stop, _, history = fit(values, patience=3)
    # 0.75, 0.71 wait 2 epochs, 0.69 resets; best 0.69 at epoch 6 (its tie at 8 is no
    # improvement); epochs 7, 8, 9 do not improve -> stop after epoch 9
    assert (stop.best_epoch, stop.best, stop.stopped_epoch) == (6, 0.69, 9)
    assert trainer.epoch == 9 and len(history.rows) == 9


def test_min_delta_and_patience_zero():
    values = [1.0, 0.95, 0.93, 0.5] + [0.4] * 16
    _, stop, _, _ = fit(values, patience=1, min_delta=0.06)  # 0.95 is not 0.06 better than 1.0
    assert stop.stopped_epoch == 2 and stop.best_epoch == 1
    _, stop, _, _ = fit([1.0, 0.9, 0.9] + [0.1] * 17, patience=0)
    assert stop.stopped_epoch == 3


def test_accuracy_is_maximised_in_auto_mode():
    values = [0.5, 0.6, 0.55, 0.9, 0.7, 0.8] + [0.0] * 14
    _, stop, _, _ = fit(values, key="val_accuracy", patience=2)
    assert (stop.best_epoch, stop.stopped_epoch) == (4, 6)  # minimising would stop at epoch 3


def test_runs_to_the_end_without_stopping():
    trainer, stop, _, _ = fit([1.0 - 0.01 * e for e in range(20)], patience=2, epochs=20)
    assert stop.stopped_epoch is None and trainer.epoch == 20


@pytest.mark.parametrize("restore", [False, True])
def test_weights_restored_only_when_asked(restore):
    values = [1.0, 0.5, 0.7, 0.8, 0.9] + [0.0] * 15
    trainer, stop, script, _ = fit(values, patience=3, restore_best_weights=restore)
    assert stop.stopped_epoch == 5
    want = script.weights[2 if restore else 5]
    got = trainer.model.state_arrays()
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert not np.array_equal(script.weights[2]["0.weight"], script.weights[5]["0.weight"])


def test_scheduler_sets_the_rate_the_epoch_uses():
    ds = blobs(samples=30, classes=3, seed=0)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 3})], (2,), seed=0)
    opt = registry.optimizers.build({"type": "SGD", "learning_rate": 0.4})
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), opt, seed=0)
    sched = LearningRateScheduler(registry.schedules.build({"type": "step", "step_size": 2, "gamma": 0.5}), 5)
    history = trainer.fit(ds.x, ds.y, epochs=5, callbacks=[sched])
    assert [r["learning_rate"] for r in history.rows] == [0.4, 0.4, 0.2, 0.2, 0.1]


BASE = {"data": {"type": "blobs", "samples": 30}, "model": [{"type": "Linear", "units": 3}],
        "loss": "SoftmaxCrossEntropy", "optimizer": "SGD"}


def test_from_config_builds_what_train_asks_for():
    cfg = config_from_dict({**BASE, "train": {"clip_norm": 1.0, "schedule": "cosine",
                                              "early_stopping": {"monitor": "train_loss", "patience": 2}}})
    cbs = from_config(cfg, has_validation=False, classification=True)
    assert [type(c).__name__ for c in cbs] == ["GradientClipping", "LearningRateScheduler", "EarlyStopping"]
    assert cbs[2].patience == 2 and cbs[2].mode == "min"
    assert from_config(config_from_dict(BASE), False, True) == []


@pytest.mark.parametrize("train,message", [
    ({"early_stopping": {}}, "monitor 'val_loss' needs validation data"),
    ({"schedule": {"type": "reduce_on_plateau"}}, "monitor 'val_loss' needs validation data"),
    ({"early_stopping": {"monitor": "train_accuracy"}}, "a regression loss gives no accuracy"),
])
def test_monitor_that_the_run_cannot_produce_is_a_config_error(train, message):
    cfg = config_from_dict({**BASE, "train": train})
    with pytest.raises(ConfigError, match=message):
        from_config(cfg, has_validation=False, classification="accuracy" not in message)


def test_early_stopping_settings_are_validated():
    with pytest.raises(ConfigError) as e:
        config_from_dict({**BASE, "train": {"early_stopping": {"monitor": "val_los", "patience": -1}}})
    text = str(e.value)
    assert "train.early_stopping.monitor" in text and "did you mean val_loss" in text
    assert "train.early_stopping.patience" in text
    with pytest.raises(ConfigError, match="expected a mapping with keys monitor, patience"):
        config_from_dict({**BASE, "train": {"early_stopping": True}})


def test_locate_terminates_for_keys_without_line_numbers():
    # config_from_dict has no file: locating "data" used to loop forever
    from dlrun.config.source import Source

    assert Source(None).locate("train.schedule").path == "train.schedule"
    assert Source(None).locate("data").line is None


def test_fit_and_evaluate_reject_labels_the_scores_cannot_index():
    """Trainer used from Python (the CLI checks labels with file rows earlier): on a GPU an
    out-of-range label would silently read another sample's scores, so the range is checked
    once per call, before any batch."""
    from dlrun.backend import CPU
    from dlrun.errors import DataError

    def trainer(units, loss):
        model = Sequential([registry.layers.build({"type": "Linear", "units": units})], (2,), CPU, np.float32, seed=0)
        return Trainer(model, registry.losses.build(loss), registry.optimizers.build("SGD"))

    x = np.zeros((4, 2), np.float32)
    t = trainer(3, "SoftmaxCrossEntropy")
    with pytest.raises(DataError, match=r"labels: the data has labels up to 3, but the model outputs 3 scores"):
        t.fit(x, np.array([0, 1, 2, 3]), epochs=1)
    with pytest.raises(DataError, match=r"has a negative label \(-1\)"):
        t.evaluate(x, np.array([0, -1, 1, 2]))
    assert t.step == 0  # nothing ran
    binary = trainer(1, "BinaryCrossEntropy")
    assert binary.fit(x, np.array([0, 1, 1, 0]), epochs=1).rows
    with pytest.raises(DataError, match="BinaryCrossEntropy takes labels 0 and 1"):
        binary.fit(x, np.array([0, 1, 2, 0]), epochs=2)


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_skips_the_short_batch_and_averages_over_the_samples_used(shuffle):
    model = Sequential([registry.layers.build({"type": "Linear", "units": 3})], (2,), seed=0)
    sgd = registry.optimizers.build({"type": "SGD", "learning_rate": 1e-30})  # below every ulp: weights stay
    tr = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), sgd, batch_size=4, shuffle=shuffle,
                 seed=5, drop_last=True)
    ds = blobs(samples=10, classes=2)  # 10 samples: batches of 4, 4 and (dropped) 2
    x, y = ds.x, ds.y
    assert tr.epoch_batches(10) == (4, 2)
    order = np.random.default_rng(np.random.SeedSequence(5).spawn(3)[2]).permutation(10) if shuffle else np.arange(10)
    used = order[:8]
    z = x[used].astype(model.dtype) @ model.layers[0].weight.data.T + model.layers[0].bias.data
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    row = tr.fit(x, y, epochs=1).rows[0]
    assert tr.step == 2
    assert row["train_loss"] == pytest.approx(-np.log(p[np.arange(8), y[used]]).mean(), rel=1e-5)
    assert row["train_accuracy"] == pytest.approx(np.mean(z.argmax(axis=1) == y[used]))
    assert Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), sgd, batch_size=4).epoch_batches(10) == (4, 3)
    assert Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), sgd, batch_size=16,
                   drop_last=True).epoch_batches(10) == (10, 1)  # a batch_size above N still trains on all N


def test_drop_last_is_a_train_setting():
    assert config_from_dict({**BASE, "train": {"drop_last": True}}).train.drop_last is True
    with pytest.raises(ConfigError, match="did you mean drop_last"):
        config_from_dict({**BASE, "train": {"drop_lst": True}})


# -- the controls' events: what they did, as data for the display ----------------------------------
class Ear(Callback):
    """Hears the events, each with the epochs finished when it came."""

    def __init__(self):
        self.heard, self.finished = [], 0

    def on_epoch_end(self, epoch, metrics):
        self.finished = epoch

    def on_event(self, event):
        self.heard.append((self.finished, event))


@pytest.mark.parametrize("restore", [False, True])
def test_early_stopping_and_restoring_are_announced(restore):
    ds = blobs(samples=60, classes=3, seed=1)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 3})], (2,), seed=0)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"),
                      batch_size=20, seed=0)
    values = [1.0, 0.5, 0.7, 0.8, 0.9] + [0.0] * 15
    stop, ear = EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=restore), Ear()
    trainer.fit(ds.x, ds.y, ds.x[:9], ds.y[:9], epochs=20, callbacks=[Script("val_loss", values), stop, ear])
    # announced during epoch 5's on_epoch_end, before the callbacks after the control heard of epoch 5
    first = (4, Event("early_stopping", 5, monitor="val_loss", value=0.5, best_epoch=2, waited=3))
    restored = (5, Event("restored_best", 5, monitor="val_loss", value=0.5, best_epoch=2))
    assert ear.heard == ([first, restored] if restore else [first])


def test_a_rate_lowered_on_a_plateau_is_announced_with_the_rates():
    ds = blobs(samples=30, classes=3, seed=0)
    model = Sequential([registry.layers.build({"type": "Linear", "units": 3})], (2,), seed=0)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"),
                      registry.optimizers.build({"type": "SGD", "learning_rate": 0.4}), seed=0)
    plateau = {"type": "reduce_on_plateau", "monitor": "train_loss", "factor": 0.5, "patience": 1}
    sched, ear = LearningRateScheduler(registry.schedules.build(plateau), 8), Ear()
    values = [1.0, 0.9, 0.95, 0.97, 0.8, 0.85, 0.9, 0.7]
    history = trainer.fit(ds.x, ds.y, epochs=8, callbacks=[Script("train_loss", values), sched, ear])
    rates = [r["learning_rate"] for r in history.rows]
    assert rates == [0.4, 0.4, 0.4, 0.2, 0.1, 0.1, 0.05, 0.025]
    changed = [e for e in range(1, 8) if rates[e] != rates[e - 1]]  # after epochs 3, 4, 6, 7
    assert [(e.kind, e.epoch, e.old_rate, e.new_rate, e.monitor, e.source) for _, e in ear.heard] == \
        [("learning_rate", k, rates[k - 1], rates[k], "train_loss", "reduce_on_plateau") for k in changed]
    sched, ear = LearningRateScheduler(registry.schedules.build({"type": "step", "step_size": 2}), 5), Ear()
    trainer.fit(ds.x, ds.y, epochs=10, callbacks=[sched, ear])
    assert ear.heard == []  # a rate set by the epoch alone is no event
