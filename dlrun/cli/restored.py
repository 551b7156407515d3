"""What `dlrun evaluate` and `dlrun predict` share: the checkpoint argument, the batch-size and
device options, and opening the checkpoint with its warnings printed."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..runs import inference
from ..errors import UsageError
from ..registry.plugins import load_plugins
from . import err

TARGET = typer.Argument(..., metavar="RUN_DIR|CHECKPOINT",
                        help="A run directory (its checkpoints/best.npz, else last.npz) or a .npz checkpoint.")
BATCH_SIZE = typer.Option(None, "--batch-size", min=1, help="Samples per forward pass.")
DEVICE = typer.Option(None, "--device", metavar="cpu|gpu", help="cpu or gpu (default: the device the run used).")


def open_trained(target: Path, device: Optional[str], plugins=()) -> inference.Restored:
    """The model and metadata of a run directory or checkpoint, on ``device``; ``plugins``
    (--plugin) are loaded first, so a plugin file that moved can be named at its new place."""
    if device is not None and device not in ("cpu", "gpu"):
        raise UsageError(f"--device: expected cpu or gpu, got {device!r}")
    load_plugins(plugins)
    restored = inference.open_model(target, device)
    for w in restored.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    return restored
