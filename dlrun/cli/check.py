"""`dlrun check`: validate a config on one batch and show shapes, parameters and memory."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..backend import format_bytes
from ..commands.check import check_config
from ..config import load_config
from ..registry.plugins import load_plugins
from rich.markup import escape

from . import app, err, out
from .catalog import PLUGIN
from .train import SET_HELP


@app.command("check")
def check_cmd(
    config: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
    plugin: list[str] = PLUGIN,
    device: Optional[str] = typer.Option(None, "--device", metavar="cpu|gpu", help="cpu or gpu (overrides the config)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", metavar="RUN_DIR|CHECKPOINT",
                                              help="Also check that this checkpoint (or run directory's best) fits the model."),
) -> None:
    """Validate a config, build the model and run one batch forward and backward; train nothing, write nothing."""
    load_plugins(plugin)
    cfg = load_config(config, set_, device=device)
    for note in cfg.warnings:
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    r = check_config(cfg, checkpoint)
    t = Table(title="model", title_justify="left")
    graph = any(row.inputs for row in r.layers)  # a graph: each node with the nodes it reads
    rows = [(str(row.index) + (f" {row.node}" if graph else ""),
             row.name + (f" ← {', '.join(row.inputs)}" if graph else ""), str(("N",) + row.output_shape).replace("'", ""),
             f"{row.params:,}" + (f" ({row.fixed:,} fixed)" if row.fixed else ""),
             *map(format_bytes, (row.param_bytes, row.grad_bytes, row.activation_bytes))) for row in r.layers]
    # One line per layer: every other column keeps its widest cell (a header may wrap between
    # words), and the layer's options are cut with '…' to fit the terminal (the config has them all).
    headers = ("# node" if graph else "#", "layer ← inputs" if graph else "layer", "output shape", "params",
               "param mem", "grad mem", "activation mem")
    for split in (False, True):  # whole headers if that leaves the layer 24 characters, else wrapped ones
        widths = [max(len(c) for c in [cells[k] for cells in rows] + (h.split() if split else [h]))
                  for k, h in enumerate(headers)]
        room = max(12, out.width - sum(w + 3 for k, w in enumerate(widths) if k != 1) - 4)
        if room >= 24:
            break
    for k, col in enumerate(headers):
        t.add_column(col, justify="left" if k in (1, 2) else "right",
                     min_width=min(widths[k], room) if k == 1 else widths[k], max_width=room if k == 1 else widths[k])
    for cells in rows:
        name = cells[1] if len(cells[1]) <= room else cells[1][:room - 1] + "…"
        t.add_row(*cells[:1], name, *cells[2:])
    t.caption = (f"input (N, {', '.join(map(str, r.input_shape))}) · batch N={r.batch_size} · {r.device} · {r.dtype} · "
                 f"memory {format_bytes(r.total_bytes)} (parameters + gradients + activations)")
    out.print(t)
    out.print(f"data {r.data!r}: {r.train_samples} training and {r.val_samples} validation samples", highlight=False)
    if r.preprocess:
        out.print(f"preprocess (fitted on the training samples): {escape(r.preprocess)}", highlight=False)
    if r.checkpoint:
        out.print(f"checkpoint {r.checkpoint} fits the model")
    out.print(f"one batch forward, loss {r.loss:.4f}, backward, one optimizer step: OK (nothing saved, nothing written)")
    for note in r.warnings:
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
