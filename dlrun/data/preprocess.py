"""Preprocessing fitted on the training split and saved with the model (``data.preprocess``):
numeric scaling, categorical encoding, missing values and class names.

:func:`fit` learns from the training samples only (as scikit-learn's ``fit`` on the training
split, Keras' ``Normalization.adapt``); :meth:`Preprocessing.transform` applies what it learned to
any samples (validation, ``evaluate``, ``predict`` and ``--resume`` inputs) in one vectorised pass
per column. :meth:`Preprocessing.record` is plain JSON (numbers, strings, lists) that a checkpoint
stores; :meth:`Preprocessing.from_record` reads it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import DataError
from .pieces import magnitudes
from .table import Table

VERSION = 1


@dataclass
class Settings:
    """The ``data.preprocess`` section of a config.

    Args:
        numeric: ``standardize`` (zero mean, unit variance), ``minmax`` (to [0, 1]) or ``none``.
        categorical: ``one_hot`` (one 0/1 column per category) or ``index`` (one column of category
            numbers 0, 1, ..., for an Embedding layer).
        missing: ``refuse`` (an error naming the row and column), ``mean`` or ``median`` (of the
            training samples; a categorical column gets its most frequent category).
        per_feature: statistics per feature (true) or one over all values (false: images, whose
            pixels share one scale).
    """

    numeric: Literal["none", "standardize", "minmax"] = "none"
    categorical: Literal["one_hot", "index"] = "one_hot"
    missing: Literal["refuse", "mean", "median"] = "refuse"
    per_feature: bool = True


@dataclass
class Preprocessing:
    """What :func:`fit` learned: the numeric offset and scale (x - offset) / scale, fill values,
    each categorical column's categories (sorted), the class names, and the input columns."""

    settings: Settings
    shape: tuple[int, ...]                # the raw per-sample shape (numeric columns of a table)
    offset: np.ndarray
    scale: np.ndarray
    fill: np.ndarray                      # per numeric feature, used where a value is missing
    columns: list[str] | None = None      # the input feature columns by name (a CSV with a header)
    categorical: list[bool] | None = None  # which of ``columns`` hold categories
    categories: list[list[str]] = field(default_factory=list)  # per categorical column
    category_fill: list[str] = field(default_factory=list)
    classes: list[str] | None = None      # class names, index k is class k
    target: str | None = None             # the label column's name

    @property
    def tabular(self) -> bool:
        return bool(self.categorical) and any(self.categorical)

    @property
    def output_names(self) -> list[str] | None:
        """The model's input columns after encoding (``region=north`` for a one-hot column)."""
        if self.columns is None:
            return None
        out, k = [], 0
        for name, cat in zip(self.columns, self.categorical or [False] * len(self.columns)):
            if cat and self.settings.categorical == "one_hot":
                out += [f"{name}={c}" for c in self.categories[k]]
            else:
                out.append(name)
            k += cat
        return out

    def describe(self) -> str:
        """One line: what is scaled and encoded, and the class names (``dlrun check`` prints it)."""
        s = self.settings
        numeric = int(np.prod(self.shape)) if self.shape else 0
        parts = [f"{numeric} numeric feature{'s' if numeric != 1 else ''} "
                 + (s.numeric if s.numeric != "none" else "unscaled")
                 + ("" if s.per_feature or s.numeric == "none" else " (one scale over all values)")]
        if self.tabular:
            cats = [c for c, k in zip(self.columns, self.categorical) if k]
            parts.append(f"{s.categorical} " + ", ".join(f"{c} ({len(v)})" for c, v in zip(cats, self.categories)))
        parts.append(f"missing values: {s.missing}")
        if self.classes is not None:
            shown = ", ".join(self.classes[:8]) + (f", ... ({len(self.classes)})" if len(self.classes) > 8 else "")
            parts.append(f"classes {shown}")
        return "; ".join(parts)

    def transform(self, x, where, name: str = "data") -> np.ndarray:
        """Raw samples (an array, or a :class:`Table`) -> the model's float64 inputs. ``where(i)``
        names sample i (file:line) in errors: a missing value under ``missing: refuse``, a category
        training never saw, a table where an array of numbers was expected or the other way round."""
        if isinstance(x, Table):
            if not self.tabular:
                raise DataError(f"{name}: columns of categories ({', '.join(x.text_names)}), but the model was trained "
                                f"on numeric columns only")
            numbers = x.numbers
        else:
            if self.tabular:
                raise DataError(f"{name}: numbers only, but the model takes categorical columns "
                                f"({', '.join(c for c, k in zip(self.columns, self.categorical) if k)}); give a CSV "
                                f"with a header naming the columns {', '.join(self.columns)}")
            numbers = np.asarray(x, dtype=np.float64)
        if tuple(numbers.shape[1:]) != self.shape:
            got, want = numbers.shape[1:], self.shape
            raise DataError(f"{name}: {int(np.prod(got))} numeric features per sample (shape {tuple(got)}), but the "
                            f"model was trained on {int(np.prod(want))} (shape {want})")
        numbers = self._numeric(numbers, where, name)
        if not self.tabular:
            return numbers
        blocks, n, t = [], 0, 0
        for cat in self.categorical:
            if cat:
                blocks.append(self._encode(x.text[:, t], t, where))
                t += 1
            else:
                blocks.append(numbers[:, n:n + 1])
                n += 1
        return np.concatenate(blocks, axis=1) if blocks else np.zeros((len(x), 0))

    def _numeric(self, x: np.ndarray, where, name: str) -> np.ndarray:
        nan = np.isnan(x)
        if nan.any():
            flat = nan.reshape(len(x), -1)
            rows = flat.any(axis=1)
            if self.settings.missing == "refuse":
                i = int(np.flatnonzero(rows)[0])
                j = int(np.flatnonzero(flat[i])[0])
                raise DataError(f"{where(i)}: {self._numeric_name(j)}: a missing value (NaN; {int(rows.sum())} "
                                f"sample{'s' if rows.sum() > 1 else ''} in all); fill missing values with "
                                f"data.preprocess: {{missing: mean}} (or median), or complete the data")
            x = np.where(nan, self.fill, x)
        if self.settings.numeric == "none":
            return x
        return (x - self.offset) / self.scale

    def _numeric_name(self, j: int) -> str:
        if self.columns is not None:
            names = [c for c, k in zip(self.columns, self.categorical or [False] * len(self.columns)) if not k]
            if j < len(names):
                return f"column {names[j]!r}"
        return f"feature {j + 1}"

    def _encode(self, v: np.ndarray, t: int, where) -> np.ndarray:
        """One categorical column: one-hot (N, K) or index (N, 1), by a search in its sorted categories."""
        cats = np.asarray(self.categories[t], dtype=str)
        column = [c for c, k in zip(self.columns, self.categorical) if k][t]
        miss = v == ""
        if miss.any():
            if self.settings.missing == "refuse":
                i = int(np.flatnonzero(miss)[0])
                raise DataError(f"{where(i)}: column {column!r}: a missing category; fill missing values with "
                                f"data.preprocess: {{missing: mean}} (a categorical column gets its most frequent "
                                f"category), or complete the data")
            v = np.where(miss, self.category_fill[t], v)
        idx = np.searchsorted(cats, v)
        ok = idx < len(cats)
        ok[ok] = cats[idx[ok]] == v[ok]
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            shown = ", ".join(cats[:12]) + (f", ... ({len(cats)} in all)" if len(cats) > 12 else "")
            raise DataError(f"{where(i)}: column {column!r}: category {str(v[i])!r} was not seen in training "
                            f"(categories: {shown})")
        if self.settings.categorical == "index":
            return idx[:, None].astype(np.float64)
        return (idx[:, None] == np.arange(len(cats))).astype(np.float64)

    def record(self) -> dict:
        """Plain JSON for a checkpoint's metadata."""
        s = self.settings
        return {"version": VERSION, "numeric": s.numeric, "categorical": s.categorical, "missing": s.missing,
                "per_feature": s.per_feature, "shape": list(self.shape),
                "offset": _flat(self.offset), "scale": _flat(self.scale), "fill": _flat(self.fill),
                "columns": self.columns, "categorical_columns": self.categorical, "categories": self.categories,
                "category_fill": self.category_fill, "classes": self.classes, "target": self.target}

    @classmethod
    def from_record(cls, rec, where: str) -> "Preprocessing":
        """The inverse of :meth:`record`; a ValueError saying what is wrong with a damaged record."""
        if not isinstance(rec, dict) or rec.get("version") != VERSION:
            raise ValueError(f"expected a preprocessing record of version {VERSION}")
        try:
            settings = Settings(rec["numeric"], rec["categorical"], rec["missing"], bool(rec["per_feature"]))
            shape = tuple(int(d) for d in rec["shape"])
            per = shape if settings.per_feature else ()
            arrays = [np.asarray(rec[k], dtype=np.float64).reshape(per) for k in ("offset", "scale", "fill")]
            columns, categorical = rec.get("columns"), rec.get("categorical_columns")
            categories = [[str(c) for c in cs] for cs in rec.get("categories") or []]
            classes = rec.get("classes")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a damaged preprocessing record ({type(e).__name__}: {e})") from None
        if settings.numeric not in ("none", "standardize", "minmax") or settings.categorical not in ("one_hot", "index") \
                or settings.missing not in ("refuse", "mean", "median"):
            raise ValueError("a preprocessing record with unknown settings")
        if categorical is not None and (columns is None or len(columns) != len(categorical)
                                        or sum(map(bool, categorical)) != len(categories)):
            raise ValueError("a preprocessing record whose columns and categories disagree")
        return cls(settings, shape, *arrays, columns=columns, categorical=categorical, categories=categories,
                   category_fill=[str(c) for c in rec.get("category_fill") or []],
                   classes=None if classes is None else [str(c) for c in classes], target=rec.get("target"))


def _flat(a: np.ndarray) -> list[float] | float:
    a = np.asarray(a, dtype=np.float64)
    return a.ravel().tolist()


def fit(settings: Settings, x, where, columns: list[str] | None = None, classes: list[str] | None = None,
        target: str | None = None) -> Preprocessing:
    """Learn the preprocessing from the training samples ``x`` (an array, or a :class:`Table`)."""
    if isinstance(x, Table):
        numbers, columns, categorical = x.numbers, x.names, list(x.categorical)
    else:
        numbers, categorical = np.asarray(x, dtype=np.float64), None
        if columns is not None and (numbers.ndim != 2 or len(columns) != numbers.shape[1]):
            columns = None
    shape = tuple(numbers.shape[1:])
    axis = 0 if settings.per_feature else None
    nan = np.isnan(numbers)
    if nan.any() and settings.missing == "refuse":  # named as transform names it
        Preprocessing(settings, shape, *([np.zeros(shape)] * 3), columns=columns,
                      categorical=categorical)._numeric(numbers, where, "data")
    with np.errstate(all="ignore"):
        if settings.missing == "median":
            fill = np.nanmedian(numbers, axis=axis) if len(numbers) else np.zeros(shape)
        else:
            fill = np.nanmean(numbers, axis=axis) if len(numbers) else np.zeros(shape)
    fill = np.nan_to_num(np.asarray(fill, dtype=np.float64))  # a column with no value at all: 0
    filled = np.where(nan, fill, numbers) if nan.any() else numbers
    offset, scale = np.zeros_like(fill), np.ones_like(fill)
    if settings.numeric == "standardize":
        offset, scale = filled.mean(axis=axis), filled.std(axis=axis)
    elif settings.numeric == "minmax":
        offset = filled.min(axis=axis)
        scale = filled.max(axis=axis) - offset
    scale = np.where(scale > 0, scale, 1.0)  # a constant feature: shifted, not divided by 0
    categories, category_fill = [], []
    if isinstance(x, Table):
        for t in range(x.text.shape[1]):
            v = x.text[:, t]
            seen, counts = np.unique(v[v != ""], return_counts=True)
            if settings.missing == "refuse" and (v == "").any():
                i = int(np.flatnonzero(v == "")[0])
                raise DataError(f"{where(i)}: column {x.text_names[t]!r}: a missing category; fill missing values "
                                f"with data.preprocess: {{missing: mean}} (a categorical column gets its most "
                                f"frequent category), or complete the data")
            categories.append(seen.tolist())
            category_fill.append(str(seen[np.argmax(counts)]) if len(seen) else "")
    return Preprocessing(settings, shape, np.asarray(offset, dtype=np.float64), np.asarray(scale, dtype=np.float64),
                         fill, columns=columns, categorical=categorical, categories=categories,
                         category_fill=category_fill, classes=classes, target=target)


def scale_spread(x: np.ndarray) -> tuple[float, int, int] | None:
    """(ratio, j_large, j_small) of the largest to the smallest typical magnitude (largest absolute
    value) among the features of ``x`` (N, ...) that are not all zero, or None with fewer than two."""
    if not len(x):
        return None
    top = magnitudes(x)  # (a piece at a time: no copy of the features)
    live = np.flatnonzero(top > 0)
    if len(live) < 2:
        return None
    j_big, j_small = int(live[np.argmax(top[live])]), int(live[np.argmin(top[live])])
    return float(top[j_big] / top[j_small]), j_big, j_small
