"""Matrix products that a CUDA graph can capture.

CuPy refuses every cuBLAS call while a stream is being captured ("calling cuBLAS API during
stream capture is currently unsupported": its ``cublas.setStream`` checks the stream before each
call), although cuBLAS itself records its kernels into a graph (NVIDIA's cuBLAS guide, "CUDA
Graphs support"; PyTorch's captured steps hold their GEMMs). :func:`matmul` calls
``cublasSgemm_v2`` / ``cublasDgemm_v2`` directly, through ctypes, on CuPy's own cuBLAS handle,
with the handle's stream set to the stream being captured. Only
:meth:`dlrun.backend.Backend.matmul` calls it, and only while a training step is captured; every
other product goes through CuPy.
"""
from __future__ import annotations

import ctypes

import numpy as np

_N, _T = 0, 1  # cublasOperation_t
_HOST = 0  # cublasPointerMode_t: alpha and beta are host values (constants, so capture-safe)
_lib = None


class Unsupported(NotImplementedError):
    """A product this route does not take (its caller then is not captured)."""


def _library():
    """libcublas as CuPy loaded it (found in this process's memory map), with the calls typed."""
    global _lib
    if _lib is not None:
        return _lib
    path = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                name = line.rsplit(None, 1)[-1]
                if "/libcublas.so" in name:  # (not libcublasLt)
                    path = name
                    break
    except OSError:
        pass
    lib = ctypes.CDLL(path or "libcublas.so")
    p, i = ctypes.c_void_p, ctypes.c_int
    for fn, real in (("cublasSgemm_v2", ctypes.c_float), ("cublasDgemm_v2", ctypes.c_double)):
        f = getattr(lib, fn)
        f.argtypes = [p, i, i, i, i, i, ctypes.POINTER(real), p, i, p, i, ctypes.POINTER(real), p, i]
        f.restype = i
    lib.cublasSetStream_v2.argtypes = [p, p]
    lib.cublasGetPointerMode_v2.argtypes = [p, ctypes.POINTER(i)]
    lib.cublasSetPointerMode_v2.argtypes = [p, i]
    for fn in ("cublasSetStream_v2", "cublasGetPointerMode_v2", "cublasSetPointerMode_v2"):
        getattr(lib, fn).restype = i
    _lib = lib
    return lib


def _layout(a) -> tuple[bool, int]:
    """(transposed, leading dimension) of 2-D array ``a`` as cuBLAS' column-major operand: a
    C-ordered matrix is its own transpose there, an F-ordered one (a ``.T`` view) itself."""
    rows, cols = a.shape
    s0, s1 = a.strides
    item = a.itemsize
    if (s1 == item or cols == 1) and s0 % item == 0 and s0 // item >= max(cols, 1):
        return False, max(s0 // item, 1)
    if (s0 == item or rows == 1) and s1 % item == 0 and s1 // item >= max(rows, 1):
        return True, max(s1 // item, 1)
    raise Unsupported("a matrix whose rows and columns are both strided")


def _rows(out):
    if not out.flags.c_contiguous:
        raise Unsupported(f"an output of shape {out.shape} that is not C-ordered")
    return out.reshape(-1, out.shape[-1])


def matmul(xp, a, b, out=None):
    """``xp.matmul(a, b, out=out)`` for float32/float64 operands of one dtype, 1-D or 2-D, or a
    C-ordered stack of rows (N-d) times a matrix, by one cuBLAS GEMM on the current stream (also
    while it is being captured)."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous:  # position-wise: every row of the stack at once
        rows = a.reshape(-1, a.shape[-1])
        if out is None:
            return matmul(xp, rows, b).reshape(a.shape[:-1] + (b.shape[1],))
        matmul(xp, rows, b, _rows(out))
        return out
    if a.ndim not in (1, 2) or b.ndim not in (1, 2) or a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise Unsupported(f"a product of {a.ndim}-d and {b.ndim}-d {a.dtype}/{b.dtype} arrays")
    a2 = a.reshape(1, -1) if a.ndim == 1 else a
    b2 = b.reshape(-1, 1) if b.ndim == 1 else b
    m, k = a2.shape
    if b2.shape[0] != k:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align")
    n = b2.shape[1]
    shape = tuple(s for s, keep in ((m, a.ndim == 2), (n, b.ndim == 2)) if keep)
    if out is None:
        out = xp.empty(shape, a.dtype)
    if out.shape != shape or out.dtype != a.dtype or not out.flags.c_contiguous:
        raise Unsupported(f"an output of shape {out.shape} and dtype {out.dtype}")
    if m == 0 or n == 0:
        return out
    if k == 0:
        out.fill(0)
        return out
    # row-major C (m, n) = A B is column-major Cᵀ (n, m) = Bᵀ Aᵀ
    tb, ldb = _layout(b2)
    ta, lda = _layout(a2)
    lib = _library()
    handle = ctypes.c_void_p(xp.cuda.device.get_cublas_handle())
    stream = ctypes.c_void_p(xp.cuda.get_current_stream().ptr)
    real = ctypes.c_float if a.dtype == np.float32 else ctypes.c_double
    gemm = lib.cublasSgemm_v2 if a.dtype == np.float32 else lib.cublasDgemm_v2
    one, zero = real(1.0), real(0.0)
    mode = ctypes.c_int()
    status = lib.cublasGetPointerMode_v2(handle, ctypes.byref(mode))
    status = status or lib.cublasSetPointerMode_v2(handle, _HOST)
    status = status or lib.cublasSetStream_v2(handle, stream)
    if not status:
        status = gemm(handle, _T if tb else _N, _T if ta else _N, n, m, k, ctypes.byref(one),
                      ctypes.c_void_p(b2.data.ptr), ldb, ctypes.c_void_p(a2.data.ptr), lda, ctypes.byref(zero),
                      ctypes.c_void_p(out.data.ptr), n)
        restored = lib.cublasSetPointerMode_v2(handle, mode.value)
        status = status or restored
    if status:
        raise RuntimeError(f"cuBLAS returned status {status} for a {m}x{k} @ {k}x{n} product")
    return out
