"""dlrun.special.ndtr (the normal CDF behind exact GELU) against Python's math.erfc."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlrun.special import SQRT1_2, ndtr, normal_pdf


def _oracle(x):  # test-only, element by element; the same rounded argument |x|·(1/√2)
    def phi(v):
        half = 0.5 * math.erfc(abs(v) * SQRT1_2)
        return half if v < 0 else 1.0 - half
    return np.vectorize(phi)(x)


def test_ndtr_within_a_few_ulps_everywhere_including_the_left_tail():
    x = np.concatenate([np.linspace(-38.0, 38.0, 40001),
                        np.random.default_rng(0).standard_normal(20000) * 4])
    ref = _oracle(x)
    ulps = np.abs(ndtr(x) - ref) / np.spacing(ref)
    assert ulps.max() <= 8, (ulps.max(), x[ulps.argmax()])  # relative accuracy down to ~1e-300


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ndtr_keeps_dtype_and_handles_inf_nan_zero(dtype):
    x = np.array([-np.inf, -1e30, -50.0, -0.0, 0.0, 50.0, 1e30, np.inf, np.nan], dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # (underflow is expected)
        y = ndtr(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y[:-1], np.array([0, 0, 0, 0.5, 0.5, 1, 1, 1], dtype))
    assert np.isnan(y[-1])


def test_ndtr_float32_close_to_float64():
    x = np.linspace(-9, 9, 5001)
    y32 = ndtr(x.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, _oracle(x), rtol=2e-5, atol=1e-7)


def test_normal_pdf_closed_form():
    x = np.linspace(-8, 8, 101)
    np.testing.assert_allclose(normal_pdf(x), np.exp(-x * x / 2) / math.sqrt(2 * math.pi), rtol=1e-15)
    assert normal_pdf(x.astype(np.float32)).dtype == np.float32
