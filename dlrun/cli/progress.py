"""The one progress callback that prints: what ``dlrun train`` shows while it trains.

On a terminal, each finished epoch leaves one line (wrapped between metrics when the terminal is
narrow) above a live status line: the epoch counter, a bar over the epoch's batches, the time
since training started and the time left for the whole run, and the last finished epoch's
metrics, labelled with that epoch, the monitored one first. The status line is fitted to the
terminal's width: the counter, the bar and the monitored metric always show; the batch count,
the clock and the other metrics give way in the reverse of that order. From a pipe or a file:
one plain line per epoch, no escape sequences, no status line.

The training controls' events (early stopping, restoring the best weights, a learning rate
lowered on a plateau) come as :class:`~dlrun.training.hooks.Event` data and are printed here, one
line each, after the line of the epoch they follow.
"""
from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..backend import threads
from ..training.hooks import Callback, Event

QUIET, NORMAL, VERBOSE = 0, 1, 2


def _fmt(v) -> str:
    return f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4e}"  # a diverging loss in a few characters


def _rate(v: float) -> str:
    return f"{v:.4g}"


def duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def label(key: str) -> str:
    """The short name a metrics.csv column has on screen: loss, acc, f1, val_loss, val_acc, val_f1."""
    name = {"train_loss": "loss", "train_accuracy": "acc", "val_accuracy": "val_acc"}.get(key)
    if name is not None:
        return name
    return key[6:] if key.startswith("train_") else key


def metric_keys(row: dict) -> list[str]:
    """The row's metrics in display order (training, then validation), only those the run has:
    no accuracy for regression, no val_* without validation data."""
    keys = [k for k in row if k.startswith(("train_", "val_")) and row[k] is not None]
    return [k for k in keys if k.startswith("train_")] + [k for k in keys if k.startswith("val_")]


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


def event_line(e: Event) -> str:
    """One line for a training control's event."""
    if e.kind == "early_stopping":
        return f"epoch {e.epoch}: early stopping ({e.monitor}: no improvement in {e.waited} epochs)"
    if e.kind == "restored_best":
        return f"restored the weights of epoch {e.best_epoch}, the best {e.monitor} ({_fmt(e.value)})"
    if e.kind == "learning_rate":
        return f"epoch {e.epoch}: learning rate {_rate(e.old_rate)} to {_rate(e.new_rate)} ({e.source} on {e.monitor})"
    return f"epoch {e.epoch}: {e.kind}"


def wrapped(head: str, items: list[tuple[str, str, bool]], tail: str, width: int | None) -> Text:
    """``head`` then each ``label value`` (the monitored one in bold) and ``tail``; with a
    ``width``, wrapped between items, continuation lines indented by ``head``'s length (a tail
    that does not fit is left out rather than given a line of its own)."""
    parts = [Text(f"{name} {value}", style="bold" if watched else "") for name, value, watched in items]
    if tail:
        parts.append(Text(tail, style="dim"))
    line, used = Text(head), len(head)
    for i, p in enumerate(parts):
        gap = 0 if i == 0 else (2 if tail and i == len(parts) - 1 else 1)
        if width is not None and i > 0 and used + gap + len(p) > width and len(head) + len(p) <= width:
            if tail and i == len(parts) - 1:
                break
            line.append("\n" + " " * len(head))
            used, gap = len(head), 0
        line.append(" " * gap)
        line.append_text(p)
        used += gap + len(p)
    return line


class _StatusLine:
    """The live line under the epoch lines, rendered at each refresh for the terminal's width."""

    def __init__(self, progress: "RichProgress"):
        self.progress = progress

    def __rich_console__(self, console, options):
        yield self.progress.status_line(options.max_width)


class RichProgress(Callback):
    """Shows the model summary, then one line per epoch (and the live status line on a
    terminal), the controls' events and the closing lines (:meth:`finish`). ``verbosity``: QUIET
    prints nothing, VERBOSE adds the run's set-up, each epoch's learning rate and the last epoch's
    metrics at the end. Use it as a context manager so the
    live line is taken down (and the terminal left clean) when training stops with an error."""

    BAR_MIN, BAR_MAX = 10, 40

    def __init__(self, console: Console, total_epochs: int, show_summary: bool = True, verbosity: int = NORMAL):
        self.console = console
        self.total = total_epochs
        self.verbosity = verbosity
        self.show_summary = show_summary and verbosity > QUIET
        self.terminal = console.is_terminal and verbosity > QUIET
        self.live: Live | None = None
        self.monitor = None
        self.epoch = self.batches = self.done = 0
        self.last: dict | None = None  # the last finished epoch's row
        self.printed = 0  # the last epoch whose line is printed (events of a later one wait for it)
        self.pending: list[Event] = []
        self.started = None  # when training began (this session)
        self.first_epoch = self.step_batches = 0  # the epochs done before this session; its batches done

    # -- the callback ------------------------------------------------------------------------------------
    def on_train_begin(self, trainer):
        self.monitor = getattr(trainer, "monitor", None)
        self.first_epoch, self.step_batches = trainer.epoch, 0  # the epochs done before this session
        self.epoch = trainer.epoch + 1
        self.trainer = trainer
        if self.show_summary:
            self.console.print(summary_table(trainer.model))
        self.started = time.perf_counter()
        if self.terminal:
            self.live = Live(_StatusLine(self), console=self.console, refresh_per_second=8, transient=True)
            self.live.start()

    def on_epoch_begin(self, epoch, batches):
        if self.verbosity >= VERBOSE and epoch == self.first_epoch + 1:
            self.console.print(self.setup_line(batches), highlight=False, markup=False, soft_wrap=True)
        self.epoch, self.batches, self.done = epoch, batches, 0

    def on_epoch_resume(self, epoch, batches_done):
        self.done = batches_done  # (done before this session: not in its pace, step_batches)

    def on_batch_end(self, epoch, batch):
        self.done = batch
        self.step_batches += 1

    def on_epoch_end(self, epoch, m):
        self.last = m
        if self.verbosity > QUIET:
            self.console.print(self.epoch_line(m, self.console.width if self.terminal else None), highlight=False,
                               soft_wrap=True)
        self.printed = epoch
        for e in self.pending:
            self._print_event(e)
        self.pending = []

    def on_event(self, event):
        if event.epoch > self.printed:  # a control acted on the epoch before its line is shown
            self.pending.append(event)
        else:
            self._print_event(event)

    def on_train_end(self, history):
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def __enter__(self) -> "RichProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def aside(self, write) -> None:
        """Call ``write`` (a print to stderr, such as a warning) with the status line taken down
        and put back after, so the two never share a line of the terminal."""
        if self.live is None:
            write()
            return
        self.live.stop()
        try:
            write()
        finally:
            self.live.start()

    def _print_event(self, e: Event) -> None:
        if self.verbosity > QUIET:
            self.console.print(event_line(e), highlight=False, markup=False, soft_wrap=True)

    # -- what is shown -----------------------------------------------------------------------------------
    def setup_line(self, batches: int) -> str:
        t = self.trainer
        n = threads.current()
        watch = f"; watching {self.monitor.name} ({'lower' if self.monitor.mode == 'min' else 'higher'} is better)" \
            if self.monitor is not None else ""
        size = "" if t.batch_size is None else f" of {t.batch_size}"
        return (f"training epochs {self.first_epoch + 1} to {self.total}: {batches} batches{size} per epoch on "
                f"{t.model.backend.name}, {t.model.dtype}, {n} BLAS thread{'s' if n != 1 else ''}{watch}")

    def _items(self, m: dict) -> list[tuple[str, str, bool]]:
        """(label, value, monitored) for each metric of row ``m``, the learning rate when verbose."""
        watched = self.monitor.name if self.monitor is not None else None
        items = [(label(k), _fmt(m[k]), k == watched) for k in metric_keys(m)]
        if self.verbosity >= VERBOSE and m.get("learning_rate") is not None:
            items.append(("lr", _rate(m["learning_rate"]), False))
        return items

    def epoch_line(self, m: dict, width: int | None) -> Text:
        """``epoch 12/30  loss 0.0637 acc 0.9910 val_loss 0.1470 val_acc 0.9861  (0.21s)``; with a
        ``width`` (a terminal), wrapped between metrics, the continuation under the first metric."""
        return wrapped(f"epoch {m['epoch']}/{self.total}  ", self._items(m), f"({m['seconds']:.2f}s)", width)

    def finish(self, s: dict) -> None:
        """The closing lines: how long the run took, and the epoch whose weights the run directory
        gives predict and evaluate (checkpoints/best.npz, the best by the monitored metric) with
        its metrics; the last epoch's too when verbose (or when no best was recorded)."""
        if self.verbosity <= QUIET:
            return
        width = self.console.width if self.console.is_terminal else None
        epochs, best, kept = s["epochs"], s.get("best"), s.get("best_epoch_metrics")
        took = f"{s['seconds']:.2f}s" if s["seconds"] < 60 else duration(s["seconds"])
        self.console.print(f"{epochs} epoch{'s' if epochs != 1 else ''} in {took}"
                           + (", stopped early" if s.get("stopped_early") else ""), highlight=False, markup=False)
        if best is not None and kept:
            self.console.print(wrapped(f"kept epoch {best['epoch']}/{epochs} (best {best['monitor']})  ",
                                       self._items(kept), "", width), highlight=False, soft_wrap=True)
        if best is None or not kept or (self.verbosity >= VERBOSE and best["epoch"] != epochs):
            self.console.print(wrapped(f"last epoch {epochs}/{epochs}  ", self._items(s), "", width), highlight=False,
                               soft_wrap=True)
        if self.verbosity >= VERBOSE and "cuda_graph" in s:  # a GPU run: did its step run as a CUDA graph
            self.console.print(f"CUDA graph: {s['cuda_graph']}", highlight=False, markup=False)

    def status_line(self, width: int) -> Text:
        """The live line, fitted to ``width`` columns (see the module docstring)."""
        counter = f"epoch {self.epoch}/{self.total}"
        batches = f"{self.done}/{self.batches}"
        elapsed = time.perf_counter() - self.started if self.started is not None else 0.0
        remaining = (self.total - self.epoch) * self.batches + (self.batches - self.done)
        pace = elapsed / self.step_batches if self.step_batches else None
        clock = f"{duration(elapsed)} ETA {duration(remaining * pace) if pace is not None else '?'}"
        metrics: list[tuple[str, str, bool]] = []
        head = ""
        if self.last is not None:
            items = self._items(self.last)
            metrics = [i for i in items if i[2]] + [i for i in items if not i[2]]  # the monitored one first
            head = f"epoch {self.last['epoch']}:"
        # what must show: counter, bar, the monitored (else first) metric; then the rest as room allows
        bar_min = self.BAR_MIN if width < 100 else 2 * self.BAR_MIN
        need = len(counter) + 1 + bar_min
        shown = metrics[:1]
        if shown:
            need += 3 + len(head) + 1 + len(shown[0][0]) + 1 + len(shown[0][1])
        optional_clock = optional_batches = False
        need += 2 if len(metrics) > 1 else 0  # (room for the '…' of metrics cut)
        if need + 1 + len(clock) <= width:
            optional_clock, need = True, need + 1 + len(clock)
        if need + 1 + len(batches) <= width:
            optional_batches, need = True, need + 1 + len(batches)
        rest = metrics[1:]
        for i, (name, value, _) in enumerate(rest):
            more = 1 + len(name) + 1 + len(value)
            if need + more - (2 if i == len(rest) - 1 else 0) > width:  # (the last one needs no '…')
                break
            shown.append(rest[i])
            need += more
        cut = len(shown) < len(metrics)
        if not cut and rest:
            need -= 2
        bar = max(bar_min, min(self.BAR_MAX, width - need + bar_min))
        line = Text(counter, style="bold")
        line.append(" ")
        filled = round(bar * self.done / self.batches) if self.batches else 0
        line.append("━" * filled, style="magenta")
        line.append("━" * (bar - filled), style="grey23")
        if optional_batches:
            line.append(" " + batches)
        if optional_clock:
            line.append(" " + clock, style="cyan")
        if shown:
            line.append(" │ " + head)
            for name, value, watched in shown:
                line.append(" ")
                line.append(f"{name} {value}", style="bold" if watched else "")
            if cut:
                line.append(" …")
        line.no_wrap, line.overflow = True, "ellipsis"
        line.truncate(width, overflow="ellipsis")
        return line
