"""Classification metrics: accuracy, top-k accuracy, and precision, recall and F1 from the
confusion matrix (with the functions ``dlrun evaluate`` reports them with).

C[i, j] counts samples of true class i predicted as class j. For class k:
precision = C[k, k] / Σ_i C[i, k], recall = C[k, k] / Σ_j C[k, j],
F1 = 2·precision·recall / (precision + recall); a 0/0 ratio is reported as 0. The macro average
is the plain mean over the classes that occur among the labels or the predictions, the weighted
one weights each class by its support (scikit-learn's ``classification_report``).
"""
from __future__ import annotations

from typing import Literal

import numpy as np

from ..backend import array_module
from ..registry.options import PositiveInt
from ..registry import metrics
from .base import Metric, predicted


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


@metrics.register("accuracy")
class Accuracy(Metric):
    """Σ 1[predicted class = label] / N. Recorded for every classification run (train_accuracy,
    val_accuracy) whether listed or not."""

    task, mode = "classification", "max"
    recorded_always = True

    def size(self):
        return 2

    def update(self, sums, z, y, loss):
        sums[0] += loss.count_correct(z, y) if hasattr(loss, "count_correct") else (predicted(loss, z) == y).sum()
        sums[1] += len(y)

    def result(self, sums):
        return sums[0] / sums[1] if sums[1] else None


@metrics.register("top_k_accuracy")
class TopKAccuracy(Metric):
    """Σ 1[fewer than k classes score above the label's] / N: the label is among the k highest
    scores (a tie at the k-th place counts as a hit, as tf.math.in_top_k).

    Args:
        k: how many of the highest-scoring classes may hold the label; below the number of classes.
    """

    task, mode = "classification", "max"

    def __init__(self, k: PositiveInt = 5):
        self.k = k

    def setup(self, loss, outputs):
        super().setup(loss, outputs)
        if self.classes != outputs or outputs < 2:
            return (f"needs one score per class, but the loss {type(loss).__name__} reads {outputs} output(s) as "
                    f"{self.classes} classes")
        if self.k >= outputs:
            return (f"k = {self.k} counts every sample as a hit: the model scores {outputs} classes; choose k "
                    f"from 1 to {outputs - 1}")
        return None

    def size(self):
        return 2

    def update(self, sums, z, y, loss):
        xp = array_module(z)
        label_score = xp.take_along_axis(z, y.reshape(-1, 1), axis=1)
        above = xp.count_nonzero(z > label_score, axis=1)
        sums[0] += xp.count_nonzero(xp.less(above, self.k))
        sums[1] += len(y)

    def result(self, sums):
        return sums[0] / sums[1] if sums[1] else None


class _FromConfusion(Metric):
    """A metric computed from the epoch's confusion matrix (C² counts, summed on the device)."""

    task, mode = "classification", "max"
    measure = ""

    def __init__(self, average: Literal["macro", "weighted", "binary"] = "macro"):
        self.average = average

    def setup(self, loss, outputs):
        super().setup(loss, outputs)
        if self.average == "binary" and self.classes != 2:
            return f"average: binary scores class 1 of two classes, but the model scores {self.classes}"
        return None

    def size(self):
        return self.classes * self.classes

    def update(self, sums, z, y, loss):
        c = self.classes
        cells = c * y + predicted(loss, z).reshape(-1)
        xp = array_module(z)
        if xp is np:
            sums += np.bincount(cells, minlength=c * c)
        else:  # CuPy's bincount reads max(cells) back to size its output: the step would wait for the GPU
            xp.add.at(sums, cells, 1.0)

    def result(self, sums):
        cm = sums.reshape(self.classes, self.classes)
        if not cm.sum():
            return None
        pc = per_class(cm)
        if self.average == "binary":
            return float(pc[self.measure][1])
        return averages(cm, pc)[self.average][self.measure]


_AVERAGE = """
    Args:
        average: macro (the mean over the classes present among labels or predictions), weighted
            (by each class's support), or binary (class 1 of two, scikit-learn's default there).
"""


@metrics.register("precision")
class Precision(_FromConfusion):
    __doc__ = "C[k, k] / Σ_i C[i, k] per class k, averaged: of the samples predicted k, the share that are k.\n" + _AVERAGE
    measure = "precision"


@metrics.register("recall")
class Recall(_FromConfusion):
    __doc__ = "C[k, k] / Σ_j C[k, j] per class k, averaged: of the samples of class k, the share predicted k.\n" + _AVERAGE
    measure = "recall"


@metrics.register("f1")
class F1(_FromConfusion):
    __doc__ = "2·P·R / (P + R) per class (P precision, R recall), averaged over the classes.\n" + _AVERAGE
    measure = "f1"
