"""Real data sets that ship inside the package (no network needed): Iris and 8×8 Digits.

Validation data is split off by ``train.validation_split`` (seeded, stratified by class).
"""
from __future__ import annotations

from importlib import resources

import numpy as np

from . import Dataset
from ..registry import data


def _load(name: str) -> dict:
    with resources.files("dlrun.data").joinpath(f"shipped/{name}.npz").open("rb") as f:
        with np.load(f, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


@data.register("iris")
def iris(standardize: bool = False) -> Dataset:
    """Fisher's Iris: 150 flowers × 4 measurements (cm), 3 classes of 50 (setosa, versicolor,
    virginica). Scale the measurements with ``data.preprocess: {numeric: standardize}``.

    Args:
        standardize: kept for runs recorded before data.preprocess (it rescaled each feature over
            all 150 rows, validation rows included); a config spells it preprocess: {numeric: standardize}.
    """
    z = _load("iris")
    x = z["x"].astype(np.float64)
    if standardize:
        x = (x - x.mean(axis=0)) / x.std(axis=0)
    return Dataset(x, z["y"].astype(np.int64), name="iris", columns=[str(c) for c in z["feature_names"]],
                   classes=[str(c) for c in z["class_names"]])


@data.register("digits")
def digits(flatten: bool = False, scale: bool = True) -> Dataset:
    """UCI 8×8 handwritten digits: 1,797 images as (N, 1, 8, 8), 10 classes.

    Args:
        flatten: return (N, 64) vectors for MLPs instead of (N, 1, 8, 8) images.
        scale: divide pixel counts (0–16) by 16 so inputs lie in [0, 1]. With ``scale: false`` and
            ``data.preprocess: {numeric: minmax, per_feature: false}`` the scaling is saved with the
            model, and predict takes raw pixel counts.
    """
    z = _load("digits")
    x = z["x"].astype(np.float64)
    if scale:
        x /= 16.0
    if flatten:
        x = x.reshape(len(x), -1)
    return Dataset(x, z["y"].astype(np.int64), name="digits")
