"""The progress callback: a live bar on a terminal, one plain line per epoch otherwise."""
import io

import numpy as np
from rich.console import Console

from dlrun import registry
from dlrun.model import Sequential
from dlrun.progress import RichProgress
from dlrun.trainer import Trainer


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
