"""`dlrun evaluate`: loss and accuracy, per-class precision/recall/F1 with their averages and a confusion
matrix; MSE, RMSE, MAE and R² for regression."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..runs import inference
from ..training.position import describe
from . import app, err, out, THREADS, use_threads
from .catalog import PLUGIN
from .restored import BATCH_SIZE, DEVICE, TARGET, open_trained


@app.command("evaluate")
def evaluate_cmd(
    target: Path = TARGET,
    data: Optional[str] = typer.Option(None, "--data", metavar="FILE|SPEC",
                                       help="A data file (CSV/.npy/.npz, labels in the last column) or a generator "
                                            "spec such as 'spiral' or '{type: spiral, seed: 7}' (default: the "
                                            "run's validation data)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    batch_size: Optional[int] = BATCH_SIZE,
    device: Optional[str] = DEVICE,
    plugin: list[str] = PLUGIN,
    threads_: Optional[str] = THREADS,
) -> None:
    """Evaluate a trained model on its run's validation data or on given data."""
    use_threads(threads_)
    restored = open_trained(target, device, plugin)
    shown = len(restored.warnings)
    x, y, described = inference.evaluation_data(restored, data)
    for note in restored.warnings[shown:]:  # (about the data given)
        err.print(f"[yellow]warning:[/] {escape(note)}", soft_wrap=True)
    result = restored.evaluate(x, y, batch_size)
    if as_json:
        print(json.dumps({"checkpoint": str(restored.path), "data": described, **result.as_dict()}, indent=2))
        return
    out.print(f"checkpoint: {restored.path} ({describe(restored.meta)})", highlight=False)
    out.print(f"data: {described}, {result.samples} samples", highlight=False)
    acc = "" if result.accuracy is None else f"  accuracy {result.accuracy:.4f}"
    out.print(f"loss {result.loss:.6g}{acc}", highlight=False)
    if result.metrics:  # the run's train.metrics
        out.print("train.metrics: " + "  ".join(f"{k} {'-' if v is None else f'{v:.4f}'}"
                                                for k, v in result.metrics.items()), highlight=False)
    if result.confusion is None:
        out.print(f"mse {result.mse:.6g}  rmse {result.rmse:.6g}  mae {result.mae:.6g}  r2 {result.r2:.4f}",
                  highlight=False)
        return
    t = Table(title="per class", title_justify="left")
    for col in ("class", "precision", "recall", "f1", "support"):
        t.add_column(col, justify="right")
    names = result.classes or [str(k) for k in range(len(result.confusion))]
    for k, (p, r, f, s) in enumerate(zip(result.precision, result.recall, result.f1, result.support)):
        t.add_row(escape(names[k]), f"{p:.4f}", f"{r:.4f}", f"{f:.4f}", str(s))
    t.add_section()
    for kind in ("macro", "weighted"):
        avg = getattr(result, kind)
        t.add_row(f"{kind} avg", f"{avg['precision']:.4f}", f"{avg['recall']:.4f}", f"{avg['f1']:.4f}",
                  str(sum(result.support)))
    out.print(t)
    out.print(confusion_table(result.confusion, names))


def confusion_table(confusion: list, names: list[str] | None = None) -> Table:
    """The confusion matrix as a table: rows the true class, columns the predicted one (named by
    ``names``, else numbered)."""
    cm = Table(title="confusion matrix (rows true, columns predicted)", title_justify="left")
    cm.add_column("true \\ pred", justify="right")
    names = names or [str(k) for k in range(len(confusion))]
    for k in range(len(confusion)):
        cm.add_column(escape(names[k]), justify="right")
    for k, row in enumerate(confusion):
        cm.add_row(escape(names[k]), *map(str, row))
    return cm
