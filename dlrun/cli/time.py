"""`dlrun time`: per-layer forward/backward timing of a config's training step."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..config import load_config
from ..registry.plugins import load_plugins
from ..commands.timing import time_config
from rich.markup import escape

from . import app, err, out, THREADS, use_threads
from .catalog import PLUGIN
from .train import SET_HELP


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


@app.command("time")
def time_cmd(
    config: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
    batches: int = typer.Option(20, "--batches", help="Timed training steps (after 2 untimed warm-up steps)."),
    device: Optional[str] = typer.Option(None, "--device", metavar="cpu|gpu", help="cpu or gpu (overrides the config)."),
    plugin: list[str] = PLUGIN,
    threads_: Optional[str] = THREADS,
) -> None:
    """Time each layer's forward and backward pass, the loss and the optimizer step (median per batch)."""
    use_threads(threads_)
    load_plugins(plugin)
    cfg = load_config(config, set_, device=device)
    for note in cfg.warnings:  # a graph node whose output nothing reads
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    r = time_config(cfg, batches)
    total = r.parts_total
    t = Table(title=f"{cfg.name}: median over {r.batches} batches of {r.batch_size} on {r.device} (ms)",
              title_justify="left")
    for col, just in (("part", "left"), ("output shape", "left"), ("forward", "right"), ("backward", "right"),
                      ("total", "right"), ("share", "right")):
        t.add_column(col, justify=just)

    def row(p_name, shape, f, b):
        s = (f or 0.0) + (b or 0.0)
        t.add_row(p_name, "" if shape is None else str(("N",) + tuple(shape)).replace("'", ""), _ms(f), _ms(b),
                  _ms(s), f"{100 * s / total:.1f}%" if total > 0 else "-")

    for p in r.layers:
        row(p.name, p.output_shape, p.forward, p.backward)
    row(r.loss.name, None, r.loss.forward, r.loss.backward)
    if r.metrics is not None:  # train.metrics: their sums, per batch
        row(r.metrics.name, None, r.metrics.forward, None)
    t.add_row("optimizer step", "", "", "", _ms(r.optimizer), f"{100 * r.optimizer / total:.1f}%" if total > 0 else "-")
    t.add_section()
    t.add_row("total of parts", "", _ms(sum(p.forward or 0 for p in r.layers) + r.loss.forward
                                        + (r.metrics.forward if r.metrics else 0.0)),
              _ms(sum(p.backward or 0 for p in r.layers) + r.loss.backward + r.optimizer), _ms(total), "100.0%")
    t.add_row("whole step", "", "", "", _ms(r.step), "")
    if r.plain_step is not None:  # GPU: as training runs it, unobserved (queued back to back)
        t.add_row("whole step, unobserved", "", "", "", _ms(r.plain_step), "")
    if r.graph_step is not None:
        t.add_row("whole step, CUDA graph", "", "", "", _ms(r.graph_step), "")
    notes = []
    if any(p.backward is None for p in r.layers):
        notes.append("backward '-': skipped in training (no earlier layer has parameters that train)")
    swapped = [f"model[{k}] after model[{k + 1}]" for k, i in enumerate(r.order) if i == k + 1]
    if swapped:
        notes.append(f"rows in execution order: {', '.join(swapped)} (a ReLU just before a MaxPool2D runs on "
                     "the smaller pooled map, with the same result: docs/performance.md)")
    if r.cuda_graph is not None:
        notes.append(f"CUDA graph (train.cuda_graph): {r.cuda_graph}")
    if not r.finite:
        notes.append("the loss became NaN or inf during these steps (the rate or the data?): NaN arithmetic can be "
                     "slower or faster than the real one")
    t.caption = "\n".join(notes) or None
    out.print(t)
