"""Kinks: elements whose finite difference crosses a branch change are skipped, not compared.

A layer with a kink (ReLU at 0, LargeMarginFC where the target logit changes sign) returns its
branch choices from ``branch_signature()``: a mask, an argmax, or a tuple of those. When the
signature after a forward at θ+h or θ−h differs from the one at θ, the two-sided difference
straddles the kink and says nothing about either branch's derivative (cs231n's "winners"
check). The element is counted as skipped; a point with more than 1% skipped is redrawn.
"""
from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..layers.base import Layer

MAX_SKIPPED = 0.01


def has_signature(layer) -> bool:
    """Whether the layer overrides ``branch_signature`` (smooth layers do not)."""
    return type(layer).branch_signature is not Layer.branch_signature


def freeze(sig):
    """A host copy of a signature, so later forwards cannot change it under us."""
    if sig is None:
        return None
    if isinstance(sig, (tuple, list)):
        return tuple(freeze(s) for s in sig)
    if isinstance(sig, dict):
        return {k: freeze(v) for k, v in sig.items()}
    if hasattr(sig, "shape"):
        return np.array(to_host(sig), copy=True)
    return sig


def same(a, b) -> bool:
    """Whether two frozen signatures are equal (arrays elementwise, containers recursively)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.shape(a) == np.shape(b) and bool(np.array_equal(a, b))
    return a == b


def too_many_skipped(skipped: int, checked: int) -> bool:
    """More than 1% of the compared elements skipped: redraw the point."""
    total = skipped + checked
    return total > 0 and skipped > MAX_SKIPPED * total
