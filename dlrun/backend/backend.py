"""The one module that chooses between numpy (CPU) and CuPy (GPU): the device.

Nothing else in dlrun imports cupy. Layers take the array module from their input with
:func:`array_module`, or use ``self.xp``, so one code path serves both devices.
"""
from __future__ import annotations

import sys

import numpy as np

from . import gemm, memory
from ..errors import BackendError

DEVICES = ("cpu", "gpu")


class Backend:
    """A device: its array module, host<->device moves, seeded generators, synchronisation."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp
        self.capturing = False  # inside :meth:`capture`'s call
        if xp is np:
            self.matmul = np.matmul  # (the CPU's products need no detour: numpy's own, called directly)

    def matmul(self, a, b, out=None):
        """``xp.matmul(a, b, out=out)``, which layers call for their products through here: while a
        CUDA graph is being captured, CuPy refuses cuBLAS calls, and a 1-D or 2-D product then goes
        to cuBLAS directly (:mod:`dlrun.backend.gemm`)."""
        if self.capturing:
            return gemm.matmul(self.xp, a, b, out)
        return self.xp.matmul(a, b, out=out)

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"

    def asarray(self, a, dtype=None):
        """Move a host array to this device (no copy on CPU when dtype already matches)."""
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a) -> np.ndarray:
        """Return ``a`` as a numpy array (a device-to-host copy on GPU)."""
        if self.xp is np:
            return np.asarray(a)
        return self.xp.asnumpy(a)

    def rng(self, seed):
        """A generator on this device, seeded by an int or a numpy SeedSequence."""
        if isinstance(seed, np.random.SeedSequence):
            seed = int(seed.generate_state(1, dtype=np.uint64)[0])
        return self.xp.random.default_rng(seed)

    def zero(self, dtype):
        """A zero to accumulate device scalars into with ``+``: a numpy scalar on the CPU (adding
        to it costs a tenth of an in-place add to a 0-d array), a 0-d array on the GPU (adding
        to it queues a kernel and never reads anything back)."""
        if self.xp is np:  # immutable, so += rebinds and a shared zero never changes
            z = _CPU_ZEROS.get(dtype)
            return z if z is not None else np.dtype(dtype).type(0)
        return self.xp.zeros((), dtype)

    def memory_available(self) -> int | None:
        """Bytes this device can still give: the host's (see :func:`host_memory_available`), or
        the GPU's free memory plus what CuPy's pool holds unused."""
        if self.xp is np:
            return memory.host_memory_available()
        try:
            free = self.xp.cuda.runtime.memGetInfo()[0]
        except Exception:  # a CUDA error: nothing to say
            return None
        return int(free) + int(self.xp.get_default_memory_pool().free_bytes())

    def read_back(self, values: list) -> list:
        """Host values of ``values`` (device scalars and vectors, host numbers, None), in one
        device-to-host transfer: scalars come back as floats (an int64 count too: exact below
        2**53), vectors as host arrays, None as None. On the GPU the device values are gathered
        into one float64 vector on the device and read with one ``get``, so the host waits once
        for all of them, not once per value; on the CPU nothing is copied (a vector comes back
        as it was given)."""
        if self.xp is np:  # (once per epoch of a run whose steps may take microseconds: kept lean)
            return [v if v is None or (type(v) is _NDARRAY and v.ndim) else float(v) for v in values]
        xp = self.xp
        dev = [v.reshape(-1) for v in values if isinstance(v, xp.ndarray)]
        flat = xp.concatenate(dev, dtype=np.float64).get() if dev else None
        out, at = [], 0
        for v in values:
            if isinstance(v, xp.ndarray):
                part, at = flat[at:at + v.size], at + v.size
                out.append(part.reshape(v.shape) if v.ndim else float(part[0]))
            else:
                out.append(_host_value(v))
        return out

    def host_buffer(self, shape, dtype) -> np.ndarray:
        """An uninitialised host array that :meth:`copy_out` fills without making the host wait:
        page-locked memory on the GPU (as ``cupyx.empty_pinned`` makes), a plain array on the CPU."""
        if self.xp is np:
            return np.empty(shape, dtype)
        dtype = np.dtype(dtype)
        mem = self.xp.cuda.alloc_pinned_memory(max(1, int(np.prod(shape, dtype=np.int64))) * dtype.itemsize)
        return np.ndarray(shape, dtype, buffer=mem)

    def copy_out(self, pairs) -> None:
        """Copy each array ``src`` of this device into ``dst``, a :meth:`host_buffer` of its
        shape, for every ``(dst, src)`` of ``pairs``. On the GPU the copies are queued and the
        host goes on at once; device work queued after them runs after them, and :meth:`copy_in`
        of ``dst`` reads what was copied. (One call for all: on the CPU ``dst[...] = src`` in
        a loop here costs half of a np.copyto call each, which on a small model's one-batch
        epochs is felt.)"""
        if self.xp is np:
            for dst, src in pairs:
                dst[...] = src
            return
        for dst, src in pairs:
            if src.flags.c_contiguous:
                src.get(out=dst, blocking=False)
            else:
                dst[...] = src.get()

    def copy_in(self, dst, src: np.ndarray) -> None:
        """Copy host array ``src`` into array ``dst`` of this device, in place, after the device
        work queued before it."""
        upload(dst, src)

    def graphs_unsupported(self) -> str | None:
        """Why this device cannot capture CUDA graphs, or None when it can."""
        if self.xp is np:
            return "the CPU runs no CUDA graphs"
        cuda = self.xp.cuda
        if getattr(cuda.runtime, "is_hip", False):
            return "CuPy on ROCm does not capture CUDA graphs"
        if not hasattr(cuda.Stream, "begin_capture"):
            return "this CuPy has no stream capture (Stream.begin_capture)"
        return None

    def capture(self, call) -> "Captured":
        """Record ``call()`` into a CUDA graph without running it (CuPy's stream capture, as
        ``torch.cuda.graph``): the kernels it queues become the graph, replayed by
        :meth:`Captured.replay` with the arguments and addresses they had here. What ``call``
        allocates comes from a memory pool of the graph's own, kept with it, so those addresses
        stay reserved for the graph (PyTorch's private pool per graph). ``call`` must not read
        the device, nor copy host data to it (CuPy refuses that while capturing)."""
        cuda = self.xp.cuda
        pool = cuda.MemoryPool()
        side = cuda.Stream(non_blocking=True)
        side.wait_event(cuda.get_current_stream().record())  # after the work queued so far
        with cuda.using_allocator(pool.malloc), side:
            side.begin_capture()
            self.capturing = True
            try:
                result = call()
            except BaseException:
                _FAILED_POOLS.append(pool)  # what the call allocated may still be referenced: its memory stays reserved
                side.end_capture()  # the half-captured graph is dropped
                raise
            finally:
                self.capturing = False
            graph = side.end_capture()
        # the blocks the ordinary steps before it used and no array holds any more go back to the
        # device: from now on the graph's own pool holds the step's temporaries
        self.xp.get_default_memory_pool().free_all_blocks()
        return Captured(graph, pool, result)

    def synchronize(self) -> None:
        if self.xp is not np:
            self.xp.cuda.Device().synchronize()

    def select_device(self, index: int) -> None:
        """Make GPU ``index`` the current device of this process (a data-parallel rank takes the
        GPU of its local rank, before it allocates anything)."""
        if self.xp is not np:
            self.xp.cuda.Device(index % self.xp.cuda.runtime.getDeviceCount()).use()

    def nccl(self):
        """CuPy's NCCL module (``cupy.cuda.nccl``) for summing gradients across GPU ranks, or None
        on the CPU or where NCCL is not installed."""
        if self.xp is np:
            return None
        try:
            from cupy.cuda import nccl
        except ImportError:
            return None
        return nccl if getattr(nccl, "available", True) else None

    def scatter_add(self, a, indices, values) -> None:
        """``a[indices] += values`` that keeps repeated indices (np.add.at / cupyx.scatter_add)."""
        at = getattr(self.xp.add, "at", None)  # CuPy >= 13 has ufunc.at like numpy
        if self.xp is np and _whole_rows(a, indices, values):
            # rows of a matrix: numpy's add.at is ~4.5x faster on the flat array with one index per
            # element than on rows (Embedding's backward: 4.6 ms -> 1.0 ms for 8192 rows of 64);
            # each element still receives its terms in the same order, so the sums are identical
            d = a.shape[1]
            flat = (indices[:, None] * d + np.arange(d)).reshape(-1)
            np.add.at(a.reshape(-1), flat, values.reshape(-1))
        elif at is not None:
            at(a, indices, values)
        else:
            import cupyx

            cupyx.scatter_add(a, indices, values)


class Captured:
    """A captured CUDA graph (:meth:`Backend.capture`): ``result`` is what the captured call
    returned (device arrays the graph writes into on every replay); ``pool`` the memory pool of
    what the call allocated (``pool.total_bytes()``: the device memory it holds)."""

    def __init__(self, graph, pool, result):
        self.graph, self.pool, self.result = graph, pool, result  # the pool keeps the graph's memory reserved

    def replay(self) -> None:
        """Queue the graph's work on the current stream (the host does not wait)."""
        self.graph.launch()


_NDARRAY = np.ndarray


def _host_value(v):
    """A host value as :meth:`Backend.read_back` gives it: None, a float, or a float64 array."""
    if v is None:
        return None
    if isinstance(v, np.ndarray) and v.ndim:
        return np.array(v, dtype=np.float64)
    return float(v)


def upload(dst, src) -> None:
    """Copy host array ``src`` into ``dst`` without making the host wait: on the GPU an
    asynchronous copy on the current stream (CUDA stages pageable host memory at once, so
    ``src`` may change as soon as this returns), on the CPU a plain copy."""
    if type(dst) is np.ndarray:
        dst[...] = src
    else:
        dst.set(src)


def _whole_rows(a, indices, values) -> bool:
    """Whether ``a[indices] += values`` adds one full row of values per index of a C-ordered
    matrix, with signed in-range indices: the case the flat scatter handles. Anything else
    (lists, broadcast values, unsigned or out-of-range indices) goes to add.at as given, which
    accepts and reports it as numpy does."""
    if not (isinstance(indices, np.ndarray) and isinstance(values, np.ndarray) and isinstance(a, np.ndarray)):
        return False
    if a.ndim != 2 or indices.ndim != 1 or indices.dtype.kind != "i" or not a.flags.c_contiguous:
        return False
    if values.shape != (len(indices), a.shape[1]) or not len(indices):
        return False
    rows = a.shape[0]
    return -rows <= int(indices.min()) and int(indices.max()) < rows


CPU = Backend("cpu", np)
_FAILED_POOLS: list = []  # the memory pools of captures that raised
_CPU_ZEROS = {t: t(0) for t in (np.float64, np.float32, np.int64)}
_gpu: Backend | None = None


def get_backend(device: str = "cpu") -> Backend:
    """Return the backend for ``device`` ('cpu' or 'gpu'), or raise a one-line BackendError."""
    global _gpu
    if device == "cpu":
        return CPU
    if device != "gpu":
        raise BackendError(f"unknown device {device!r}; expected one of: cpu, gpu")
    if _gpu is not None:
        return _gpu
    try:
        import cupy
    except ImportError:
        raise BackendError(
            "device 'gpu' needs CuPy, which is not installed; install it with "
            "pip install 'dlrun[gpu]' (CuPy for CUDA 12), or use --device cpu"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDA driver missing or broken
        raise BackendError(f"device 'gpu': CuPy found no usable CUDA driver ({e}); use --device cpu") from None
    if count < 1:
        raise BackendError("device 'gpu': CuPy is installed but no CUDA device is visible; use --device cpu")
    _gpu = Backend("gpu", cupy)
    return _gpu


def gpu_available() -> bool:
    """True when CuPy imports and a CUDA device answers (used by tests to skip)."""
    try:
        get_backend("gpu")
    except BackendError:
        return False
    return True


def array_module(x):
    """numpy or cupy, whichever owns ``x`` (like chainer's get_array_module)."""
    if type(x) is np.ndarray:  # the hot case, decided without a string test
        return np
    if type(x).__module__.startswith("cupy"):
        return sys.modules["cupy"]
    return np


def to_host(x) -> np.ndarray:
    """Any array (numpy or cupy) as a numpy array."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)
