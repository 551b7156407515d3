"""`dlrun predict`: predictions of a trained model for a CSV or .npy file of features."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..runs import inference
from ..errors import TrainingError, UsageError
from ..runs.rundir import FAULTS
from . import app, err, THREADS, use_threads
from .catalog import PLUGIN
from .restored import BATCH_SIZE, DEVICE, TARGET, open_trained


@app.command("predict")
def predict_cmd(
    target: Path = TARGET,
    input: Path = typer.Option(..., "--input", "-i", help="Features: CSV (header optional) or .npy, one sample per row."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the CSV here instead of stdout."),
    proba: bool = typer.Option(False, "--proba", help="Add one probability column per class (proba_0, proba_1, ..., or proba_NAME for named classes)."),
    batch_size: Optional[int] = BATCH_SIZE,
    device: Optional[str] = DEVICE,
    plugin: list[str] = PLUGIN,
    threads_: Optional[str] = THREADS,
) -> None:
    """Write a CSV with a header and one row per input: `prediction` (class name or index, or value)."""
    use_threads(threads_)
    restored = open_trained(target, device, plugin)
    x = inference.read_features(input, restored.model.input_shape, restored.model.dtype, restored.model,
                                restored.preprocess, restored.delimiter)
    table = inference.predictions(restored, x, proba, batch_size)
    if output is None:
        inference.write_csv(table, sys.stdout)
        return
    try:
        inference.save_csv(table, output)
    except OSError as e:  # a full disk or I/O fault fails the command (1), as in train; a bad path is usage (2)
        kind = TrainingError if e.errno in FAULTS else UsageError
        raise kind(f"--output {output}: cannot write the file ({e.strerror or e}); nothing was written") from None
    err.print(f"{len(x)} predictions written to {output}", highlight=False)
