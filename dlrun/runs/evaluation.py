"""What ``dlrun evaluate`` reports: loss, accuracy, the confusion matrix and per-class
precision/recall/F1 with their averages for classification; MSE, RMSE, MAE and R² for regression
(the formulas are :mod:`dlrun.metrics`')."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import DataError
from ..metrics import averages, confusion_matrix, per_class, regression_metrics


@dataclass
class Evaluation:
    """What `dlrun evaluate` reports. The classification fields (``confusion``, the per-class lists
    and ``macro``/``weighted`` averages) are None for regression, the regression ones (``mse``,
    ``rmse``, ``mae``, ``r2``, without the regularization that ``loss`` includes) for classification.
    ``metrics``: the run's train.metrics by name (empty without them)."""

    samples: int
    loss: float
    accuracy: float | None
    confusion: list | None = None
    precision: list | None = None
    recall: list | None = None
    f1: list | None = None
    support: list | None = None
    macro: dict | None = None
    weighted: dict | None = None
    mse: float | None = None
    rmse: float | None = None
    mae: float | None = None
    r2: float | None = None
    metrics: dict = field(default_factory=dict)
    classes: list | None = None  # class names (the confusion matrix's rows and columns), when the run has them

    def as_dict(self) -> dict:
        d = asdict(self)
        if d["classes"] is None:  # (a run without class names reports as it always did)
            del d["classes"]
        return d


def evaluate(model, loss, x: np.ndarray, y: np.ndarray, batch_size: int | None = None, penalty: float = 0.0,
             tracker=None) -> Evaluation:
    """Loss (plus ``penalty``, the run's regularization, as ``val_loss``), accuracy, per-class or
    regression metrics and ``tracker``'s train.metrics of ``model`` on host arrays (x, y): one
    forward pass in evaluation mode, in batches of ``batch_size`` (all at once without it)."""
    if len(x) == 0:
        raise DataError("no samples to evaluate")
    classification = getattr(loss, "task", "classification") == "classification"
    outputs = model.output_shape[-1] if model.output_shape else 1
    if classification:
        y = np.asarray(y)
        if y.dtype.kind not in "iu" or y.ndim != 1:
            raise DataError(f"classification needs one integer label per sample, got labels of dtype {y.dtype} "
                            f"and shape {y.shape}")
        classes = loss.classes(outputs) if hasattr(loss, "classes") else outputs  # plugin losses may lack it
        if (y < 0).any() or (y >= classes).any():
            bad = int(np.flatnonzero((y < 0) | (y >= classes))[0])
            raise DataError(f"sample {bad + 1}: label {int(y[bad])} is outside the model's {classes} classes "
                            f"(0 to {classes - 1})")
    else:
        y = np.asarray(y, dtype=np.float64)
    z, total, correct, sums = _forward(model, loss, x, y, batch_size, tracker, classification)
    n = len(x)
    found = tracker.results(sums, "") if tracker is not None else {}
    if not classification:
        return Evaluation(n, total / n + penalty, None, **regression_metrics(y, z), metrics=found)
    pred = np.asarray(loss.predict(z)) if hasattr(loss, "predict") else z.argmax(axis=1)  # BCE: z > 0
    cm = confusion_matrix(y, pred, classes)
    pc = per_class(cm)
    return Evaluation(n, total / n + penalty, correct / n, cm.tolist(), pc["precision"].tolist(),
                      pc["recall"].tolist(), pc["f1"].tolist(), pc["support"].tolist(), **averages(cm, pc),
                      metrics=found)


def _forward(model, loss, x, y, batch_size, tracker, classification):
    """The one pass: (outputs on the host, summed loss × batch size, correct count, metric sums)."""
    b, n = model.backend, len(x)
    bs = n if batch_size is None else max(1, min(batch_size, n))
    ydt = np.int64 if classification else model.dtype
    loss_sum, correct = b.zero(np.float64), b.zero(np.int64)
    sums = tracker.zeros() if tracker is not None else None
    outs = []
    model.eval()
    try:
        for s in range(0, n, bs):
            xb = b.asarray(np.ascontiguousarray(x[s:s + bs]), dtype=model.dtype)
            yb = b.asarray(np.ascontiguousarray(y[s:s + bs]), dtype=ydt)
            z = model.forward(xb)
            loss_sum += len(yb) * loss.forward(z, yb)
            if sums is not None:
                tracker.add(sums, z, yb, loss)
            if classification:
                correct += loss.count_correct(z, yb)
            outs.append(np.array(b.to_host(z)))  # (a copy: the next batch may reuse a layer's buffer)
    finally:
        model.train()
    return np.concatenate(outs), float(loss_sum), int(correct), sums
