"""Evaluation metrics: loss, accuracy, the confusion matrix and per-class precision/recall/F1 for
classification; MSE, RMSE, MAE and R² for regression.

C[i, j] counts samples of true class i predicted as class j. For class k:
precision = C[k, k] / Σ_i C[i, k], recall = C[k, k] / Σ_j C[k, j],
F1 = 2·precision·recall / (precision + recall); a 0/0 ratio is reported as 0. The macro average
is the plain mean over classes, the weighted one weights each class by its support (scikit-learn's
``classification_report``).
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


def averages(cm: np.ndarray, pc: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Macro and support-weighted averages of precision, recall and F1. The macro average is over
    the classes that occur among the labels or the predictions (scikit-learn's default labels):
    a class the model can score but that never appears would add a 0 to it."""
    present = (cm.sum(axis=0) + cm.sum(axis=1)) > 0
    support = pc["support"].astype(np.float64)
    weights = support / support.sum() if support.sum() > 0 else np.zeros_like(support)
    return {kind: {m: float(np.mean(pc[m][present]) if kind == "macro" else pc[m] @ weights)
                   for m in ("precision", "recall", "f1")} for kind in ("macro", "weighted")}


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """MSE, RMSE and MAE over every output of every sample, and R² = 1 − SS_res/SS_tot per output
    averaged over the outputs. An output whose targets are constant (SS_tot = 0) scores R² = 1 when
    it is predicted exactly, else 0 (scikit-learn's ``r2_score``)."""
    t = np.asarray(y_true, dtype=np.float64).reshape(len(y_pred), -1)
    d = np.asarray(y_pred, dtype=np.float64).reshape(t.shape) - t
    sq = np.square(d)
    ss_res = sq.sum(axis=0)
    ss_tot = np.square(t - t.mean(axis=0)).sum(axis=0)
    r2 = np.where(ss_tot > 0, 1.0 - _ratio(ss_res, ss_tot), np.where(ss_res == 0, 1.0, 0.0))
    mse = float(sq.mean())
    return {"mse": mse, "rmse": float(np.sqrt(mse)), "mae": float(np.abs(d).mean()), "r2": float(r2.mean())}


@dataclass
class Evaluation:
    """What `dlrun evaluate` reports. The classification fields (``confusion``, the per-class lists
    and ``macro``/``weighted`` averages) are None for regression, the regression ones (``mse``,
    ``rmse``, ``mae``, ``r2``, without the regularization that ``loss`` includes) for classification."""

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
        return Evaluation(len(x), m["loss"], None, **regression_metrics(y, pred))
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
                      pc["recall"].tolist(), pc["f1"].tolist(), pc["support"].tolist(), **averages(cm, pc))
