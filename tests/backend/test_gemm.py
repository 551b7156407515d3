"""dlrun.backend.gemm, the cuBLAS route a captured CUDA graph takes for matrix products, checked
without a GPU: its calls go to a stand-in for libcublas that does what the cuBLAS reference says
``cublas<t>gemm`` does with column-major operands (op(A) m×k at lda, op(B) k×n at ldb, C m×n at
ldc), on the arrays' memory. A wrong transpose flag, leading dimension or operand order gives
another product here, as it would on the device."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from dlrun.backend import gemm


class _Dev(np.ndarray):
    """A host array with CuPy's ``.data.ptr``."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _dev(a):
    return np.asarray(a).view(_Dev)


def _column_major(ptr, rows, cols, ld, dtype):
    """The rows x cols column-major matrix at ``ptr`` with leading dimension ``ld`` (a view)."""
    item = np.dtype(dtype).itemsize
    size = (cols - 1) * ld + rows
    buf = (ctypes.c_char * (size * item)).from_address(ptr)
    flat = np.frombuffer(buf, dtype, size)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


class _FakeCublas:
    def __init__(self):
        self.calls, self.mode, self.stream = [], 0, None

    def _gemm(self, dtype):
        def gemm(handle, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            assert self.mode == 0, "alpha and beta are host pointers: the pointer mode must be HOST"
            a_rows, a_cols = (m, k) if ta == 0 else (k, m)
            b_rows, b_cols = (k, n) if tb == 0 else (n, k)
            assert lda >= max(1, a_rows) and ldb >= max(1, b_rows) and ldc >= max(1, m), "a leading dimension too small"
            A = _column_major(a.value, a_rows, a_cols, lda, dtype)
            B = _column_major(b.value, b_rows, b_cols, ldb, dtype)
            C = _column_major(c.value, m, n, ldc, dtype)
            opa, opb = (A if ta == 0 else A.T), (B if tb == 0 else B.T)
            product = alpha._obj.value * (opa.astype(np.float64) @ opb)
            # with beta 0 cuBLAS does not read C (it may hold NaN); else C = alpha op(A) op(B) + beta C
            C[...] = product if beta._obj.value == 0 else product + beta._obj.value * C
            self.calls.append((ta, tb, m, n, k, lda, ldb, ldc))
            return 0
        return gemm

    def __getattr__(self, name):
        if name == "cublasSgemm_v2":
            return self._gemm(np.float32)
        if name == "cublasDgemm_v2":
            return self._gemm(np.float64)
        raise AttributeError(name)

    def cublasSetStream_v2(self, handle, stream):
        self.stream = stream.value
        return 0

    def cublasGetPointerMode_v2(self, handle, mode):
        mode._obj.value = self.mode
        return 0

    def cublasSetPointerMode_v2(self, handle, mode):
        self.mode = mode
        return 0


@pytest.fixture
def fake(monkeypatch):
    lib = _FakeCublas()
    lib.mode = 1  # CuPy may leave its handle in device pointer mode: the route sets HOST and puts it back
    monkeypatch.setattr(gemm, "_library", lambda: lib)
    xp = types.SimpleNamespace(
        empty=lambda shape, dtype: _dev(np.empty(shape, dtype)),
        cuda=types.SimpleNamespace(device=types.SimpleNamespace(get_cublas_handle=lambda: 1234),
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=5678)))
    return lib, xp


CASES = {  # what dlrun's layers multiply: Linear forward, weight and bias gradients, input gradient
    "x @ W.T": lambda r: (r.standard_normal((5, 3)), r.standard_normal((4, 3)).T),
    "dy.T @ x": lambda r: (r.standard_normal((5, 4)).T, r.standard_normal((5, 3))),
    "ones @ dy": lambda r: (np.ones(5), r.standard_normal((5, 4))),
    "dy @ W": lambda r: (r.standard_normal((5, 4)), r.standard_normal((4, 3))),
    "one row": lambda r: (r.standard_normal((1, 3)), r.standard_normal((3, 4))),
    "one column": lambda r: (r.standard_normal((6, 3)), r.standard_normal((3, 1))),
    "g . g": lambda r: (r.standard_normal(7), r.standard_normal(7)),
    "matrix @ vector": lambda r: (r.standard_normal((4, 6)), r.standard_normal(6)),
    "a column of a matrix": lambda r: (r.standard_normal((4, 6))[:, 1:4], r.standard_normal((3, 2))),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_the_direct_route_multiplies_as_numpy_does(case, dtype, fake):
    lib, xp = fake
    a, b = (_dev(np.asarray(v, dtype)) for v in CASES[case](np.random.default_rng(0)))
    want = np.matmul(a.view(np.ndarray), b.view(np.ndarray))
    got = gemm.matmul(xp, a, b)
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-12)
    out = _dev(np.full(want.shape, np.nan, dtype))
    assert gemm.matmul(xp, a, b, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-6 if dtype == np.float32 else 1e-12)
    assert lib.stream == 5678 and lib.mode == 1  # on the current stream; the handle's mode put back


def test_what_the_route_does_not_take_is_named(fake):
    _, xp = fake
    r = np.random.default_rng(1)
    with pytest.raises(gemm.Unsupported):
        gemm.matmul(xp, _dev(r.standard_normal((2, 3, 4))), _dev(r.standard_normal((2, 4, 2))))  # a batch of products
    with pytest.raises(gemm.Unsupported):
        gemm.matmul(xp, _dev(r.standard_normal((2, 3))), _dev(r.standard_normal((3, 2)).astype(np.float32)))
    with pytest.raises(gemm.Unsupported):  # every other row and every other column
        gemm.matmul(xp, _dev(r.standard_normal((6, 8))[::2, ::2]), _dev(r.standard_normal((4, 2))))
    with pytest.raises(ValueError):
        gemm.matmul(xp, _dev(r.standard_normal((2, 3))), _dev(r.standard_normal((4, 2))))


@pytest.mark.parametrize("given_out", [False, True])
def test_a_stack_of_rows_times_a_matrix_is_one_product(given_out, fake):
    lib, xp = fake
    r = np.random.default_rng(2)
    a, b = _dev(r.standard_normal((3, 4, 5))), _dev(r.standard_normal((6, 5)).T)
    want = np.matmul(a.view(np.ndarray), b.view(np.ndarray))
    out = _dev(np.empty((3, 4, 6))) if given_out else None
    got = gemm.matmul(xp, a, b, out)
    assert got.shape == (3, 4, 6) and (out is None or got is out)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert lib.calls[-1][2:5] == (6, 12, 5)  # one GEMM: n = 6 columns, m = 12 rows, k = 5
