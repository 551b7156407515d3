"""`dlrun train` (new runs, --resume, --init-from)."""
from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .. import parallel
from ..runs import run
from ..config import load_config
from ..errors import UsageError
from ..registry.plugins import load_plugins
from .progress import NORMAL, QUIET, VERBOSE, RichProgress
from . import app, err, out, report_lost, THREADS, use_threads
from .catalog import PLUGIN

SET_HELP = "Override a config key by its dotted path, e.g. train.epochs=5 or model[0].units=64 (repeatable)."


def _warn(text: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)


@app.command("train")
def train_cmd(
    config: Optional[Path] = typer.Argument(None, help="YAML config file (omit with --resume)."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
    device: Optional[str] = typer.Option(None, "--device", metavar="cpu|gpu", help="cpu or gpu (overrides the config)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Folder for run directories."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (overrides the config)."),
    plugin: list[str] = PLUGIN,
    threads_: Optional[str] = THREADS,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the run directory (and warnings and errors)."),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Also print the run's set-up, each epoch's learning rate and the last epoch's "
                                      "metrics."),
    resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR",
                                          help="Continue RUN_DIR from checkpoints/last.npz (optimizer and RNG state "
                                               "included) up to train.epochs, which --set may raise."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", metavar="CHECKPOINT",
                                             help="Start a new run from a checkpoint's (or run directory's) weights, "
                                                  "with a fresh optimizer."),
) -> None:
    """Train the model a config describes; write a new run directory and print its path.

    Under ``mpiexec -n K`` the K processes train one model data-parallel (docs/training.md);
    rank 0 writes the run directory and prints."""
    use_threads(threads_)
    world = parallel.join()  # one process, or a rank of several (mpiexec)
    world.on_lost = report_lost  # a rank that ends while the others wait for it: one line, every rank stops
    with world.preparing():  # an error here reaches every rank: they stop together
        if quiet and verbose:
            raise UsageError("give --quiet or --verbose, not both")
        load_plugins(plugin)
        if resume is not None:
            if config is not None or init_from is not None or seed is not None:
                raise UsageError("--resume RUN_DIR takes its config, weights and seed from the run; "
                                 "drop the CONFIG argument, --init-from and --seed (use --set to change settings)")
            notes: list[str] = []
            cfg, ckpt = run.resume_config(resume, set_, device, notes)
            for note in notes:  # a plugin moved (given with --plugin) or changed since the checkpoint
                err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
            if run.config_edited(resume, ckpt):
                err.print(f"[yellow]warning:[/] {escape(str(resume))}/config.yaml differs from the config recorded in "
                          f"the checkpoint (edited by hand?); --resume continues with the recorded one and rewrites "
                          f"the file. Change settings with --set", soft_wrap=True)
        elif config is None:
            raise UsageError("give a CONFIG file to train, or --resume RUN_DIR to continue a run")
        else:
            cfg = load_config(config, set_, seed=seed, device=device)
            if world.writes:
                for note in cfg.warnings:  # a graph node whose output nothing reads
                    err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    # several ranks: rank 0 shows the progress
    verbosity = QUIET if quiet else VERBOSE if verbose else NORMAL
    with RichProgress(out, cfg.train.epochs, verbosity=verbosity) if world.writes else nullcontext() as progress:
        shown = [progress] if world.writes else []
        # (a warning while training: with the status line taken down)
        warn = _warn if progress is None else (lambda text: progress.aside(lambda: _warn(text)))
        if resume is not None:
            result = run.resume(resume, cfg, ckpt, callbacks=shown, warn=warn)
        else:
            result = run.train(cfg, runs_dir, callbacks=shown, init_from=init_from, warn=warn)
    if not world.writes:
        return
    progress.finish(result.summary)
    out.print(str(result.run_dir))
    if result.signal is not None:  # it came after the last epoch: the run finished, and says so
        err.print(f"interrupted: {signal.Signals(result.signal).name} received as training finished; the run is "
                  f"complete (summary.json and checkpoints written), nothing to resume", markup=False)
        raise typer.Exit(128 + result.signal)

