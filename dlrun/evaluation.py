"""What ``dlrun evaluate`` reports: loss, accuracy, the confusion matrix and per-class
precision/recall/F1 with their averages for classification; MSE, RMSE, MAE and R² for regression
(the formulas are :mod:`dlrun.metrics`')."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import DataError
from .metrics import averages, confusion_matrix, per_class, regression_metrics
from .trainer import Trainer, predict


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

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate(trainer: Trainer, x: np.ndarray, y: np.ndarray, batch_size: int | None = None) -> Evaluation:
    """Loss (with the run's regularization, as ``val_loss``), accuracy and per-class metrics."""
    if len(x) == 0:
        raise DataError("no samples to evaluate")
    if not trainer.classification:
        y = np.asarray(y, dtype=np.float64)
        m = trainer.evaluate(x, y, batch_size)
        pred = predict(trainer.model, x, batch_size or trainer.batch_size)
        return Evaluation(len(x), m["loss"], None, **regression_metrics(y, pred), metrics=m["metrics"])
    y = np.asarray(y)
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise DataError(f"classification needs one integer label per sample, got labels of dtype {y.dtype} "
                        f"and shape {y.shape}")
    loss = trainer.loss
    outputs = trainer.model.output_shape[-1]
    classes = loss.classes(outputs) if hasattr(loss, "classes") else outputs  # plugin losses may lack it
    if (y < 0).any() or (y >= classes).any():
        bad = int(np.flatnonzero((y < 0) | (y >= classes))[0])
        raise DataError(f"sample {bad + 1}: label {int(y[bad])} is outside the model's {classes} classes "
                        f"(0 to {classes - 1})")
    m = trainer.evaluate(x, y, batch_size)
    z = predict(trainer.model, x, batch_size or trainer.batch_size)
    pred = np.asarray(loss.predict(z)) if hasattr(loss, "predict") else z.argmax(axis=1)  # BCE: z > 0
    cm = confusion_matrix(y, pred, classes)
    pc = per_class(cm)
    return Evaluation(len(x), m["loss"], m["accuracy"], cm.tolist(), pc["precision"].tolist(),
                      pc["recall"].tolist(), pc["f1"].tolist(), pc["support"].tolist(), **averages(cm, pc),
                      metrics=m["metrics"])
