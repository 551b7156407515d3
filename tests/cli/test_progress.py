"""The progress callback: a live bar on a terminal, one plain line per epoch otherwise."""
import io

import numpy as np
from rich.console import Console

from dlrun import registry
from dlrun.model import Sequential
from dlrun.cli.progress import RichProgress
from dlrun.training.trainer import Trainer


def _fit(console, epochs=3):
    model = Sequential([registry.layers.build({"type": "Linear", "units": 2})], (3,), seed=0)
    tr = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"), batch_size=4)
    x = np.random.default_rng(0).standard_normal((10, 3))
    tr.fit(x, np.arange(10) % 2, epochs=epochs, callbacks=[RichProgress(console, epochs)])


def test_plain_output_is_one_line_per_epoch():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=False, width=120))
    lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3", "3/3"]
    assert "\x1b[" not in buf.getvalue()


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


def test_terminal_output_uses_a_live_bar():
    buf = io.StringIO()
    _fit(Console(file=buf, force_terminal=True, width=120))
    text = buf.getvalue()
    assert "\x1b[" in text and "epoch 3/3" in text and "3/3" in text
    assert "model" in text  # the summary table comes first


def test_live_bar_is_taken_down_when_training_fails():
    """An error mid-training (here a callback raising) must not leave the live display running."""
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)

    class Boom(RichProgress):
        def on_epoch_end(self, epoch, m):
            super().on_epoch_end(epoch, m)
            self.bar = self.progress
            if epoch == 2:
                raise RuntimeError("boom")

    model = Sequential([registry.layers.build({"type": "Linear", "units": 2})], (3,), seed=0)
    tr = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"), batch_size=4)
    x = np.random.default_rng(0).standard_normal((10, 3))
    progress = Boom(console, 5)
    try:
        with progress:
            tr.fit(x, np.arange(10) % 2, epochs=5, callbacks=[progress])
    except RuntimeError:
        pass
    assert not progress.bar.live.is_started and progress.progress is None  # the live display was stopped
