"""Regression metrics: mean absolute error, mean squared error, its root and R² (with the
function ``dlrun evaluate`` reports them with). Each is over every output of every sample."""
from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..registry import metrics
from .base import Metric


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """MSE, RMSE and MAE over every output of every sample, and R² = 1 − SS_res/SS_tot per output
    averaged over the outputs. An output whose targets are constant (SS_tot = 0) scores R² = 1 when
    it is predicted exactly, else 0 (scikit-learn's ``r2_score``)."""
    t = np.asarray(y_true, dtype=np.float64).reshape(len(y_pred), -1)
    d = np.asarray(y_pred, dtype=np.float64).reshape(t.shape) - t
    sq = np.square(d)
    return {"mse": float(sq.mean()), "rmse": float(np.sqrt(sq.mean())), "mae": float(np.abs(d).mean()),
            "r2": r2_score(sq.sum(axis=0), np.square(t - t.mean(axis=0)).sum(axis=0))}


def r2_score(ss_res: np.ndarray, ss_tot: np.ndarray) -> float:
    """The mean over outputs of 1 − SS_res/SS_tot; 1 or 0 for constant targets (exact or not)."""
    safe = np.where(ss_tot > 0, ss_tot, 1.0)
    return float(np.where(ss_tot > 0, 1.0 - ss_res / safe, np.where(ss_res == 0, 1.0, 0.0)).mean())


class _Errors(Metric):
    """Sums of a function of the errors d = z − y, and their count."""

    task = "regression"
    mode = "min"

    def size(self):
        return 2

    def errors(self, d):
        raise NotImplementedError

    def update(self, sums, z, y, loss):
        d = z - y.reshape(z.shape)
        sums[0] += self.errors(d).sum(dtype=np.float64)
        sums[1] += d.size


@metrics.register("mae")
class MAE(_Errors):
    """(1/(N·K)) Σ |z − y|: the mean absolute error over every output of every sample."""

    def errors(self, d):
        return array_module(d).abs(d)

    def result(self, sums):
        return sums[0] / sums[1] if sums[1] else None


@metrics.register("mse")
class MSE(_Errors):
    """(1/(N·K)) Σ (z − y)²: the mean squared error (the MSE loss without regularization)."""

    def errors(self, d):
        return d * d

    def result(self, sums):
        return sums[0] / sums[1] if sums[1] else None


@metrics.register("rmse")
class RMSE(MSE):
    """sqrt((1/(N·K)) Σ (z − y)²), in the targets' units; of the whole epoch, not a mean of batches'."""

    def result(self, sums):
        return float(np.sqrt(sums[0] / sums[1])) if sums[1] else None


@metrics.register("r2")
class R2(Metric):
    """R² = 1 − Σ(y − z)² / Σ(y − ȳ)² per output, averaged over the outputs (scikit-learn's
    ``r2_score``): 1 is a perfect fit, 0 no better than predicting the mean, and below 0 worse.
    An output with constant targets scores 1 when predicted exactly, else 0. Σ(y − ȳ)² is
    gathered batch by batch as a mean and a sum of squared deviations (Chan et al.'s pairwise
    update), in float64, so targets far from 0 (a large offset) lose no precision to cancellation."""

    task = "regression"
    mode = "max"

    def size(self):
        return 3 * self.outputs + 1  # per output: the mean of y, Σ(y − ȳ)², Σ(z − y)²; the sample count

    def update(self, sums, z, y, loss):
        k, nb = self.outputs, len(z)
        z2 = z.reshape(nb, k)
        d = z2 - y.reshape(z2.shape)
        t = y.reshape(z2.shape).astype(np.float64)
        mb = t.mean(axis=0)
        t -= mb
        na = sums[3 * k].copy()  # the count before this batch
        n = nb + na
        delta = mb - sums[:k]
        sums[:k] += delta * (nb / n)
        sums[k:2 * k] += (t * t).sum(axis=0) + delta * delta * (nb * na / n)
        sums[2 * k:3 * k] += (d * d).sum(axis=0, dtype=np.float64)
        sums[3 * k] += nb

    def result(self, sums):
        k, n = self.outputs, sums[-1]
        if not n:
            return None
        mean, ss_tot, ss_res = sums[:k], sums[k:2 * k].copy(), sums[2 * k:3 * k]
        # constant targets: what remains is the rounding of their mean (a few ulps per sample)
        ss_tot[ss_tot <= n * (64 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), 1e-300)) ** 2] = 0.0
        return r2_score(ss_res, ss_tot)
