"""dlrun.backend.special.ndtr (the normal CDF behind exact GELU) against Python's math.erfc."""
from __future__ import annotations

import math
from decimal import Decimal, getcontext

import numpy as np
import pytest

from dlrun.backend.special import SQRT1_2, ndtr, normal_pdf


def _oracle(x):
    """Φ(x) element by element from math.erfc, corrected to first order for the rounding of its
    argument: u = |x|·(1/√2) is off from |x|/√2 by d (found with 50 decimal digits), and
    erfc(u − d) = erfc(u) + (2/√π)·exp(−u²)·d. Without it the oracle itself is off by about
    2u²·2⁻⁵³ relative (hundreds of ulps in the far left tail)."""
    getcontext().prec = 50

    def phi(v):
        a = abs(float(v))
        u = a * SQRT1_2
        d = float(Decimal(u) - Decimal(a) / Decimal(2).sqrt())
        half = 0.5 * math.erfc(u) + d * math.exp(-u * u) / math.sqrt(math.pi)
        return half if v < 0 else 1.0 - half
    return np.vectorize(phi)(x)


def test_ndtr_within_a_few_ulps_everywhere_including_the_left_tail():
    x = np.concatenate([np.linspace(-38.0, 38.0, 40001), [-3.0, -5.3, -10.1, -20.7, -33.2326, -37.5],
                        np.random.default_rng(0).standard_normal(20000) * 4])
    ref = _oracle(x)
    ulps = np.abs(ndtr(x) - ref) / np.spacing(ref)
    # relative accuracy down to ~1e-300 (before the exact split of −x²/2: 278 ulps at x = −20.7)
    assert ulps.max() <= 8, (ulps.max(), x[ulps.argmax()])


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
    np.testing.assert_allclose(y32, _oracle(x.astype(np.float32)), rtol=1e-6, atol=1e-7)  # was 1.2e-5 at −12.9


def test_normal_pdf_closed_form():
    x = np.linspace(-8, 8, 101)
    np.testing.assert_allclose(normal_pdf(x), np.exp(-x * x / 2) / math.sqrt(2 * math.pi), rtol=1e-15)
    assert normal_pdf(x.astype(np.float32)).dtype == np.float32
