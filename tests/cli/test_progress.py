"""The progress callback: one line per epoch, the live status line fitted to the width, the
controls' events; a live line on a terminal only."""
import io
import time

import numpy as np
import pytest
from rich.console import Console

from dlrun import registry
from dlrun.cli.progress import QUIET, VERBOSE, RichProgress, duration, event_line
from dlrun.metrics.monitor import Monitor
from dlrun.model import Sequential
from dlrun.training.hooks import Event
from dlrun.training.trainer import Trainer


def _fit(console, epochs=3, **kwargs):
    model = Sequential([registry.layers.build({"type": "Linear", "units": 2})], (3,), seed=0)
    tr = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"), batch_size=4)
    x = np.random.default_rng(0).standard_normal((10, 3))
    tr.fit(x, np.arange(10) % 2, epochs=epochs, callbacks=[RichProgress(console, epochs, **kwargs)])


def test_plain_output_is_one_line_per_epoch():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=False, width=120))
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3", "3/3"]
    assert "\x1b[" not in buf.getvalue()


def test_plain_lines_never_wrap_whatever_the_width():
    """From a pipe or a file each epoch is one log line, however many metrics it has."""
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=False, width=20), verbosity=VERBOSE)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 3 and all(ln.endswith("s)") and " lr " in ln for ln in lines)


def test_quiet_prints_nothing():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=True, width=80), verbosity=QUIET)
    assert buf.getvalue() == ""


def test_epoch_lines_show_only_the_figures_the_run_has():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=False, width=120))  # classification without validation data
    line = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch 1/3"))
    assert line.split()[2:6:2] == ["loss", "acc"] and "val_" not in line and " - " not in line
    buf = io.StringIO()
    model = Sequential([registry.layers.build({"type": "Linear", "units": 1})], (3,), seed=0)
    tr = Trainer(model, registry.losses.build("MSE"), registry.optimizers.build("SGD"), batch_size=4)
    x = np.random.default_rng(0).standard_normal((10, 3))
    tr.fit(x, x[:, :1], x, x[:, :1], epochs=1, callbacks=[RichProgress(Console(file=buf, width=120), 1)])
    line = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch 1/1"))
    assert line.split()[2:6:2] == ["loss", "val_loss"] and "acc" not in line  # regression: no accuracy


def test_terminal_output_uses_a_live_line():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=True, width=120))
    text = buf.getvalue()
    assert "\x1b[" in text and "epoch 3/3" in text and "━" in text
    assert "model" in text  # the summary table comes first


ROW = {"epoch": 12, "train_loss": 0.0637, "train_accuracy": 0.991, "train_f1": 0.991, "train_top_k_accuracy": 0.9972,
       "val_loss": 0.147, "val_accuracy": 0.9861, "val_f1": 0.9855, "val_top_k_accuracy": 0.9972,
       "learning_rate": 0.002, "seconds": 0.21}


def _progress(width, monitor="val_accuracy", total=300):
    p = RichProgress(Console(file=io.StringIO(), force_terminal=True, width=width), total)
    p.monitor = Monitor(monitor, "max")
    p.started = time.perf_counter() - 12.0
    p.on_epoch_begin(13, 45)
    for b in range(1, 18):
        p.on_batch_end(13, b)
    p.last = ROW
    return p


@pytest.mark.parametrize("monitor", ["val_accuracy", "val_top_k_accuracy", "train_f1"])
def test_status_line_at_80_columns_keeps_counter_bar_and_monitored_metric(monitor):
    p = _progress(80, monitor)
    line = p.status_line(80).plain
    assert len(line) <= 80
    assert line.startswith("epoch 13/300 ━━━━━━━━━━")  # the counter and at least 10 columns of bar
    value = f"{ROW[monitor]:.4f}"
    shown = {"val_accuracy": "val_acc", "train_f1": "f1"}.get(monitor, monitor)
    assert f"epoch 12: {shown} {value}" in line  # the monitored metric first, labelled with its epoch
    assert line.endswith("…")  # the other metrics are cut first
    assert " ETA " in line  # the clock next; then the batch count, when there is room
    assert ("17/45" in line) == (monitor != "val_top_k_accuracy")


def test_status_line_at_160_columns_shows_more_and_a_longer_bar():
    narrow, wide = _progress(80).status_line(80).plain, _progress(160).status_line(160).plain
    assert len(wide) <= 160 and wide.count("━") > narrow.count("━")
    assert all(f"{k} " in wide for k in ("val_acc", "loss", "acc", "f1", "val_loss"))


def test_status_line_gives_way_in_order_on_a_narrow_terminal():
    """Below 80 columns the batch count, then the clock, give way; the rest is cut with '…'."""
    p = _progress(50)
    line = p.status_line(50).plain
    assert len(line) <= 50 and line.startswith("epoch 13/300 ━") and "17/45" not in line


def test_status_line_before_the_first_epoch_ends_has_no_metrics():
    p = _progress(80)
    p.last = None
    line = p.status_line(80).plain
    assert line.startswith("epoch 13/300 ━") and "│" not in line and "ETA" in line


def test_epoch_line_wraps_between_metrics_on_a_terminal():
    p = _progress(80)
    text = p.epoch_line(ROW, 80).plain
    lines = text.splitlines()
    assert len(lines) > 1 and all(len(ln) <= 80 for ln in lines)
    assert lines[0].startswith("epoch 12/300  loss 0.0637 acc 0.9910")
    assert all(ln.startswith(" " * len("epoch 12/300  ") + "val_") for ln in lines[1:])
    assert all(f"{k} " in text for k in ("val_acc", "val_f1", "val_top_k_accuracy", "top_k_accuracy"))
    assert len(p.epoch_line(ROW, None).plain.splitlines()) == 1  # a pipe: one line


def test_events_are_one_line_each():
    assert event_line(Event("early_stopping", 47, monitor="val_accuracy", value=0.95, best_epoch=27, waited=20)) \
        == "epoch 47: early stopping (val_accuracy: no improvement in 20 epochs)"
    assert event_line(Event("restored_best", 47, monitor="val_accuracy", value=0.95, best_epoch=27)) \
        == "restored the weights of epoch 27, the best val_accuracy (0.9500)"
    assert event_line(Event("learning_rate", 30, monitor="val_loss", old_rate=0.01, new_rate=0.001,
                            source="reduce_on_plateau")) \
        == "epoch 30: learning rate 0.01 to 0.001 (reduce_on_plateau on val_loss)"


def test_an_event_is_printed_after_the_line_of_its_epoch():
    buf = io.StringIO()
    p = RichProgress(Console(file=buf, force_terminal=False, width=120), 5, show_summary=False)
    p.on_epoch_begin(1, 3)
    p.on_event(Event("early_stopping", 1, monitor="val_loss", value=0.5, best_epoch=1, waited=0))  # (a control first)
    assert buf.getvalue() == ""
    p.on_epoch_end(1, {"epoch": 1, "train_loss": 0.5, "seconds": 0.1})
    assert [ln.split()[0:2] for ln in buf.getvalue().splitlines()] == [["epoch", "1/5"], ["epoch", "1:"]]


def test_durations():
    assert [duration(s) for s in (0.4, 42, 187, 7500)] == ["0s", "42s", "3m07s", "2h05m"]


def test_live_line_is_taken_down_when_training_fails():
    """An error mid-training (here a callback raising) must not leave the live display running."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)

    class Boom(RichProgress):
        def on_epoch_end(self, epoch, m):
            super().on_epoch_end(epoch, m)
            self.seen = self.live
            if epoch == 2:
                raise RuntimeError("boom")

    model = Sequential([registry.layers.build({"type": "Linear", "units": 2})], (3,), seed=0)
    tr = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"), batch_size=4)
    x = np.random.default_rng(0).standard_normal((10, 3))
    progress = Boom(console, 5)
    with pytest.raises(RuntimeError):
        with progress:
            tr.fit(x, np.arange(10) % 2, epochs=5, callbacks=[progress])
    assert not progress.seen.is_started and progress.live is None  # the live display was stopped
