"""`dlrun check`: a config's dry run (validate it, build the model, run one batch forward and
backward), or a registered component's gradient check (as `dlrun gradcheck NAME`)."""
from __future__ import annotations

import inspect
import os
from dataclasses import fields
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .. import registry
from ..backend import format_bytes
from ..commands.check import check_config
from ..config import load_config
from ..errors import UsageError
from ..gradcheck import Settings
from ..registry.options import did_you_mean
from ..registry.plugins import load_plugins
from . import app, err, out, THREADS, use_threads
from .catalog import PLUGIN
from .gradcheck import CHECKED, check_one, settings_options
from .train import SET_HELP


def check_cmd(target: str, set_: list[str], plugin: list[str], device: Optional[str],
              checkpoint: Optional[Path], threads_: Optional[str], json_: bool, **options) -> None:
    """Dry-run a CONFIG.yaml: validate it, build the model and run one batch forward and backward
    (train nothing, write nothing). Given the NAME of a registered layer, loss or regularizer
    (built-in or from --plugin) instead, gradient-check it as `dlrun gradcheck NAME` does: the
    same options, report and exit codes (0 PASS, 1 FAIL, 2 cannot run)."""
    use_threads(threads_)
    load_plugins(plugin)
    config_file = Path(target).exists() or target.endswith((".yaml", ".yml")) or "/" in target or os.sep in target
    if not config_file and any(target in r for r in registry.REGISTRIES.values()):
        if checkpoint is not None:
            raise UsageError(f"--checkpoint applies to a CONFIG.yaml's dry run, not to the gradient check of {target!r}")
        check_one(target, set_, json_, Settings(**options, device=device or "cpu").resolved())
    if not config_file:
        names = [n for r in CHECKED for n in r.names()]
        raise UsageError(f"{target!r} is neither a file nor a registered layer, loss or regularizer"
                         f"{did_you_mean(target, names)}; give a CONFIG.yaml or a NAME from dlrun list")
    given = [f"--{f.name.replace('_', '-')}" for f in fields(Settings) if f.name in options
             and options[f.name] != f.default] + (["--json"] if json_ else [])
    if given:
        raise UsageError(f"{', '.join(given)}: option(s) of a component's gradient check; {target} is a config, "
                         f"which check runs for one training step (dlrun gradcheck {target} checks its model's "
                         f"gradients)")
    cfg = load_config(Path(target), set_, device=device)
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


_COMMAND = [
    inspect.Parameter("target", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str,
                      default=typer.Argument(..., metavar="CONFIG.yaml|NAME",
                                             help="A config file to dry-run, or a layer, loss or regularizer name to "
                                                  "gradient-check (e.g. LargeMarginFC).")),
    inspect.Parameter("set_", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
                      default=typer.Option([], "--set", metavar="KEY=VALUE",
                                           help=SET_HELP[:-len(" (repeatable).")] + "; for a NAME, one of its options, "
                                                "e.g. units=4 (repeatable).")),
    inspect.Parameter("plugin", inspect.Parameter.KEYWORD_ONLY, annotation=list[str], default=PLUGIN),
    inspect.Parameter("device", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                      default=typer.Option(None, "--device", metavar="cpu|gpu",
                                           help="cpu or gpu (overrides the config; for a NAME, where the checked "
                                                "code runs, default cpu).")),
    inspect.Parameter("checkpoint", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path],
                      default=typer.Option(None, "--checkpoint", metavar="RUN_DIR|CHECKPOINT",
                                           help="Also check that this checkpoint (or run directory's best) fits the "
                                                "config's model.")),
    inspect.Parameter("threads_", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str], default=THREADS),
    inspect.Parameter("json_", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--json", help="For a NAME: print the report as JSON.")),
]
check_cmd.__signature__ = inspect.Signature(_COMMAND + settings_options(exclude=("device",)))
app.command("check")(check_cmd)
