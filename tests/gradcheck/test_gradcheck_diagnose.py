"""gradcheck names the pattern of a wrong gradient (gradcheck.diagnose) and the shape slips."""
from __future__ import annotations

import numpy as np
import pytest
from broken_layers import MissingFactor, TransposedWeightGrad
from test_gradcheck_broken import registered

from dlrun.gradcheck import FAIL, Settings, check_layer
from dlrun.gradcheck.diagnose import describe
from dlrun.layers.linear import Linear
from dlrun.layers.requ import ReQU

N = np.random.default_rng(0).standard_normal(12)
ALL = np.arange(12)


def _describe(a, n=N, shape=(12,), bad=None):
    return describe("w", shape, a, n, ALL[:n.size], np.abs(a - n) > 1e-3 if bad is None else bad)


@pytest.mark.parametrize("factor, shown", [(2.0, "2 ×"), (0.5, "1/2 ×"), (1 / 7, "1/7 ×"), (3.7, "3.7 ×")])
def test_a_constant_factor_is_named(factor, shown):
    assert f"gradient for w is {shown} the finite differences at every element" in _describe(factor * N)


def test_a_flipped_sign_is_named():
    assert "is the negative of the finite differences at every element: a sign is flipped" in _describe(-N)


def test_a_transposed_square_gradient_is_named():
    n = np.random.default_rng(1).standard_normal((4, 4))
    note = describe("w", (4, 4), n.T.ravel(), n.ravel(), np.arange(16), np.abs(n.T - n).ravel() > 1e-3)
    assert "is the transpose of the finite differences" in note


def test_a_gradient_left_at_zero_is_named():
    assert "is 0 at every element compared" in _describe(np.zeros(12))


def test_failures_in_one_row_are_located_and_scattered_ones_are_not():
    n = np.random.default_rng(2).standard_normal((6, 4))
    a = n.copy()
    a[3] += 1.0
    note = describe("w", (6, 4), a.ravel(), n.ravel(), np.arange(24), np.abs(a - n).ravel() > 1e-3)
    assert note.startswith("4 of the 24 elements compared fail, all at index 3 of axis 0 (of 6)")
    a = n.copy()
    a[[0, 2, 4], [0, 1, 2]] += 1.0  # three rows and three columns: no axis confines them
    assert describe("w", (6, 4), a.ravel(), n.ravel(), np.arange(24), np.abs(a - n).ravel() > 1e-3) is None


def test_no_pattern_is_claimed_for_an_unrelated_error():
    rng = np.random.default_rng(3)
    assert _describe(rng.standard_normal(12)) is None
    assert _describe(N * 1.001, bad=np.ones(12, bool)) is None  # too close to 1 to call a factor


def test_the_patterns_reach_the_report():
    with registered(MissingFactor) as name:
        report = check_layer(name)
    x = next(t for t in report.tensors if t.name == "x")
    assert x.status == FAIL and any("1/2 × the finite differences" in n for n in x.notes), x.notes

    class FlippedBias(Linear):
        def backward(self, dy):
            self.weight.grad[...] = dy.T @ self._x
            self.bias.grad[...] = -dy.sum(axis=0)
            return dy @ self.weight.data

    with registered(FlippedBias) as name:
        report = check_layer(name)
    bias = next(t for t in report.tensors if t.name == "bias")
    assert any("a sign is flipped" in n for n in bias.notes), bias.notes
    assert not any("sign" in n for t in report.tensors if t.name != "bias" for n in t.notes)


def test_a_transposed_weight_gradient_is_named_in_all_three_forms():
    with registered(TransposedWeightGrad) as name:  # p.grad = x.T @ dy: a (D, units) array
        report = check_layer(name)
    structure = next(a for a in report.aux if a.name == "grad-structure")
    assert "grad shape (3, 4) != param shape (4, 3) (transposed" in structure.detail

    class AssignsTransposed(Linear):  # p.grad[...] = x.T @ dy: numpy refuses the broadcast
        def backward(self, dy):
            self.weight.grad[...] = self._x.T @ dy
            self.bias.grad[...] = dy.sum(axis=0)
            return dy @ self.weight.data

    with registered(AssignsTransposed) as name:
        report = check_layer(name)
    assert "into shape (4,3)" in report.error and "each other's transpose" in report.error, report.error

    with registered(AssignsTransposed) as name:  # square W: it runs, and is transposed
        report = check_layer(name, settings=Settings(dims="D=3,C=3"))
    weight = next(t for t in report.tensors if t.name == "weight")
    assert any("is the transpose of the finite differences" in n for n in weight.notes), weight.notes


def test_a_misshapen_rebound_gradient_is_reported_with_its_own_shape():
    # bias.grad = dy.sum(axis=1): shape (N,); it was reported as (1,), the shape after the one-row
    # backward the unwritten-elements check runs
    class RowSums(Linear):
        def backward(self, dy):
            self.weight.grad[...] = dy.T @ self._x
            self.bias.grad = dy.sum(axis=1)
            return dy @ self.weight.data

    with registered(RowSums) as name:
        report = check_layer(name)
    structure = next(a for a in report.aux if a.name == "grad-structure")
    assert "bias: grad shape (7,) != param shape (4,)" in structure.detail, structure.detail


def test_a_missing_return_is_suggested():
    class NoReturn(ReQU):
        def backward(self, dy):
            dy * self._xpos

    with registered(NoReturn) as name:
        report = check_layer(name)
    structure = next(a for a in report.aux if a.name == "grad-structure")
    assert "x: backward gave no gradient (None: a missing return?)" in structure.detail
