"""Metrics: those ``train.metrics`` records every epoch (registered, like every other component;
``dlrun list metrics``) and the functions ``dlrun evaluate`` reports with."""
from .base import Metric, Tracker, build, metric_mode, predicted
from .classification import averages, confusion_matrix, per_class
from .regression import r2_score, regression_metrics

__all__ = ["Metric", "Tracker", "build", "metric_mode", "predicted", "averages", "confusion_matrix",
           "per_class", "r2_score", "regression_metrics"]
