"""The one progress callback that prints: a live rich bar on a terminal, else a line per epoch."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..training.hooks import Callback


def _fmt(v) -> str:
    return f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4e}"  # a diverging loss in a few characters


def summary_table(model) -> Table:
    """The model summary: index, layer, output shape, parameter count; for a graph also each
    node's name (or place in the config) and the nodes it reads."""
    t = Table(title="model", title_justify="left")
    rows = model.summary()
    graph = any(r.inputs for r in rows)
    cols = (("#", "right"), *((("node", "left"),) if graph else ()), ("layer", "left"),
            *((("inputs", "left"),) if graph else ()), ("output shape", "left"), ("params", "right"))
    for col, just in cols:
        t.add_column(col, justify=just)
    for r in rows:
        params = f"{r.params:,}" + ("" if r.params == r.trainable else f" ({r.params - r.trainable:,} fixed)")
        shape = str(("N",) + r.output_shape).replace("'", "")
        if graph:
            t.add_row(str(r.index), r.node, r.name, ", ".join(r.inputs), shape, params)
        else:
            t.add_row(str(r.index), r.name, shape, params)
    t.caption = f"input (N, {', '.join(map(str, model.input_shape))}) · {model.num_parameters:,} parameters · {model.backend.name} · {model.dtype}"
    return t


_FIXED = {"train_loss", "train_accuracy", "val_loss", "val_accuracy"}


class RichProgress(Callback):
    """Shows the model summary, then per-epoch progress. Use it as a context manager so the
    live bar is taken down (and the terminal left clean) when training stops with an error."""

    def __init__(self, console: Console, total_epochs: int, show_summary: bool = True):
        self.console = console
        self.total = total_epochs
        self.show_summary = show_summary
        self.live = console.is_terminal
        self.progress = None

    def on_train_begin(self, trainer):
        if self.show_summary:
            self.console.print(summary_table(trainer.model))
        if self.live:
            self.progress = Progress(TextColumn("[bold]epoch {task.fields[epoch]}/{task.fields[epochs]}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("{task.fields[metrics]}"), TimeElapsedColumn(),
                                     console=self.console)
            self.progress.start()
            self.task = self.progress.add_task("train", total=1, epoch=trainer.epoch, epochs=self.total, metrics="")

    def on_epoch_begin(self, epoch, batches):
        if self.progress:
            self.progress.reset(self.task, total=batches, epoch=epoch, epochs=self.total,
                                metrics=self.progress.tasks[0].fields.get("metrics", ""))

    def on_epoch_resume(self, epoch, batches_done):
        if self.progress:
            self.progress.advance(self.task, batches_done)

    def on_batch_end(self, epoch, batch):
        if self.progress:
            self.progress.advance(self.task)

    def on_epoch_end(self, epoch, m):
        # only the figures the run has: no accuracy for regression, no val_* without validation data
        extra = [k for k in m if k.startswith(("train_", "val_")) and k not in _FIXED]  # train.metrics
        shown = (("loss", "train_loss"), ("acc", "train_accuracy"), *((k[6:], k) for k in extra if k[0] == "t"),
                 ("val_loss", "val_loss"), ("val_acc", "val_accuracy"), *((k, k) for k in extra if k[0] == "v"))
        text = " ".join(f"{label} {_fmt(m[key])}" for label, key in shown if m.get(key) is not None)
        if self.progress:
            self.progress.update(self.task, metrics=text)
        else:
            self.console.print(f"epoch {epoch}/{self.total}  {text}  ({m['seconds']:.2f}s)", highlight=False)

    def on_train_end(self, history):
        self.close()

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None

    def __enter__(self) -> "RichProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
