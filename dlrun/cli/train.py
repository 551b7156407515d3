"""`dlrun train`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import run
from ..config import load_config
from ..plugins import load_plugins
from ..progress import RichProgress
from . import app, out

SET_HELP = "Override a config key by its dotted path, e.g. train.epochs=5 or model[0].units=64 (repeatable)."


@app.command("train")
def train_cmd(
    config: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or gpu (overrides the config)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Folder for run directories."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (overrides the config)."),
    plugin: list[str] = typer.Option([], "--plugin", help="Python file with user components to load first (repeatable)."),
) -> None:
    """Train the model a config describes; write a new run directory and print its path."""
    load_plugins(plugin)
    cfg = load_config(config, set_, seed=seed, device=device)
    result = run.train(cfg, runs_dir, callbacks=[RichProgress(out, cfg.train.epochs)])
    s = result.summary
    acc = "" if s["train_accuracy"] is None else f" train_accuracy={s['train_accuracy']:.4f}"
    val = "" if s["val_loss"] is None else f" val_loss={s['val_loss']:.4f}" + (
        "" if s["val_accuracy"] is None else f" val_accuracy={s['val_accuracy']:.4f}")
    out.print(f"train_loss={s['train_loss']:.4f}{acc}{val} epochs={s['epochs']} seconds={s['seconds']:.2f}")
    out.print(str(result.run_dir))
