"""`dlrun predict`: predictions of a trained model for a CSV or .npy file of features."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .. import inference
from ..errors import UsageError
from . import app, err


@app.command("predict")
def predict_cmd(
    target: Path = typer.Argument(..., metavar="RUN_DIR|CHECKPOINT",
                                  help="A run directory (its checkpoints/best.npz, else last.npz) or a .npz checkpoint."),
    input: Path = typer.Option(..., "--input", "-i", help="Features: CSV (header optional) or .npy, one sample per row."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the CSV here instead of stdout."),
    proba: bool = typer.Option(False, "--proba", help="Add one probability column per class (proba_0, proba_1, ...)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Samples per forward pass."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or gpu (default: the device the run used)."),
) -> None:
    """Write a CSV with a header and one row per input: `prediction` (class index or value)."""
    if device is not None and device not in ("cpu", "gpu"):
        raise UsageError(f"--device: expected cpu or gpu, got {device!r}")
    restored = inference.open_model(target, device)
    for w in restored.warnings:
        err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    x = inference.read_features(input, restored.model.input_shape)
    table = inference.predictions(restored, x, proba, batch_size)
    if output is None:
        inference.write_csv(table, sys.stdout)
        return
    try:
        with open(output, "w", newline="") as f:
            inference.write_csv(table, f)
    except OSError as e:
        raise UsageError(f"--output {output}: cannot write the file ({e.strerror or e})") from None
    err.print(f"{len(x)} predictions written to {output}", highlight=False)
