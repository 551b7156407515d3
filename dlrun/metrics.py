"""Evaluation metrics: loss, accuracy, the confusion matrix and per-class precision/recall/F1.

C[i, j] counts samples of true class i predicted as class j. For class k:
precision = C[k, k] / Σ_i C[i, k], recall = C[k, k] / Σ_j C[k, j],
F1 = 2·precision·recall / (precision + recall); a 0/0 ratio is reported as 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .errors import DataError
from .trainer import Trainer, predict


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) int64 counts: rows are true classes, columns predicted classes."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    return np.bincount(y_true * classes + y_pred, minlength=classes * classes).reshape(classes, classes)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros(num.shape, dtype=np.float64), where=den > 0)


def per_class(cm: np.ndarray) -> dict[str, np.ndarray]:
    """Precision, recall, F1 and support (true count) for every class of a confusion matrix."""
    tp = np.diag(cm).astype(np.float64)
    precision = _ratio(tp, cm.sum(axis=0).astype(np.float64))
    recall = _ratio(tp, cm.sum(axis=1).astype(np.float64))
    f1 = _ratio(2 * precision * recall, precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1, "support": cm.sum(axis=1)}


@dataclass
class Evaluation:
    """What `dlrun evaluate` reports; ``confusion`` and the per-class lists are None for regression."""

    samples: int
    loss: float
    accuracy: float | None
    confusion: list | None = None
    precision: list | None = None
    recall: list | None = None
    f1: list | None = None
    support: list | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate(trainer: Trainer, x: np.ndarray, y: np.ndarray, batch_size: int | None = None) -> Evaluation:
    """Loss (with the run's regularization, as ``val_loss``), accuracy and per-class metrics."""
    if len(x) == 0:
        raise DataError("no samples to evaluate")
    if not trainer.classification:
        m = trainer.evaluate(x, np.asarray(y, dtype=np.float64), batch_size)
        return Evaluation(len(x), m["loss"], None)
    y = np.asarray(y)
    if y.dtype.kind not in "iu" or y.ndim != 1:
        raise DataError(f"classification needs one integer label per sample, got labels of dtype {y.dtype} "
                        f"and shape {y.shape}")
    outputs = trainer.model.output_shape[-1]
    if (y < 0).any() or (y >= outputs).any():
        bad = int(np.flatnonzero((y < 0) | (y >= outputs))[0])
        raise DataError(f"sample {bad + 1}: label {int(y[bad])} is outside the model's {outputs} classes "
                        f"(0 to {outputs - 1})")
    m = trainer.evaluate(x, y, batch_size)
    pred = predict(trainer.model, x, batch_size or trainer.batch_size).argmax(axis=1)
    cm = confusion_matrix(y, pred, outputs)
    pc = per_class(cm)
    return Evaluation(len(x), m["loss"], m["accuracy"], cm.tolist(), pc["precision"].tolist(),
                      pc["recall"].tolist(), pc["f1"].tolist(), pc["support"].tolist())
