"""The one module that chooses between numpy (CPU) and CuPy (GPU).

Nothing else in dlrun imports cupy. Layers take the array module from their input with
:func:`array_module`, or use ``self.xp``, so one code path serves both devices.
"""
from __future__ import annotations

import os
import sys

try:
    import resource  # POSIX: the address-space limit (ulimit -v)
except ImportError:  # Windows
    resource = None

import numpy as np

from ..errors import BackendError

DEVICES = ("cpu", "gpu")


class Backend:
    """A device: its array module, host<->device moves, seeded generators, synchronisation."""

    def __init__(self, name: str, xp):
        self.name = name
        self.xp = xp

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
            return host_memory_available()
        try:
            free = self.xp.cuda.runtime.memGetInfo()[0]
        except Exception:  # a CUDA error: nothing to say
            return None
        return int(free) + int(self.xp.get_default_memory_pool().free_bytes())

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


KERNELS: list = []  # every elementwise kernel dlrun declares, in import order


class Kernel:
    """A CuPy ElementwiseKernel, declared once as a module constant and built on first GPU use.

    One launch does what numpy does in several in-place passes (an optimizer update, say); on
    GPU each pass is a kernel launch with its own Python overhead. ``in_params``,
    ``out_params`` and ``operation`` are as in ``cupy.ElementwiseKernel``; outputs may be read.
    Declaring kernels at import, not inline where they run, puts every CUDA source dlrun has
    in :data:`KERNELS`, so a test compiles each one with NVRTC even on a machine with no GPU.
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str):
        if any(k.name == name for k in KERNELS):
            raise ValueError(f"a kernel named {name!r} is already declared")
        self.in_params, self.out_params, self.operation, self.name = in_params, out_params, operation, name
        self._built = None
        KERNELS.append(self)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"

    def on(self, xp):
        """The compiled kernel when ``xp`` is CuPy, else None (numpy keeps its ufuncs)."""
        if xp is np:
            return None
        if self._built is None:
            self._built = xp.ElementwiseKernel(self.in_params, self.out_params, self.operation, self.name)
        return self._built


def out_args(buffer) -> tuple:
    """A fused kernel's output argument: a reused buffer, or none (the kernel then allocates)."""
    return () if buffer is None else (buffer,)


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


def host_memory_available() -> int | None:
    """Bytes of host memory this process can still get, or None where nothing says: the least of
    what the OS can still give (Linux's MemAvailable, else free pages), what the process's
    control group may still use (a container's limit), and what its address-space limit
    (``ulimit -v``) leaves. Used to refuse, with a message, sizes that would get the process
    killed (Linux overcommits: a 15 GiB numpy allocation succeeds, touching it does not)."""
    found = [v for v in (_os_available(), _cgroup_available(), _rlimit_available()) if v is not None]
    return min(found) if found else None


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _os_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """A cgroup v2 (memory.max − memory.current) or v1 (limit − usage) limit, else None."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_int(limit), _read_int(usage)
        if cap is not None and used is not None and cap < 2**60:  # v1 writes "no limit" as a huge number
            return max(cap - used, 0)
    return None


def _rlimit_available() -> int | None:
    """What RLIMIT_AS (``ulimit -v``) leaves above the process's address space (VmSize), else None."""
    if resource is None:
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return max(soft - size, 0)


def ensure_fits(need: float, what: str, backend: Backend | None = None) -> None:
    """MemoryError ("x of shape (…) needs about 3.6 TiB …, more than the 20.1 GiB of memory
    available") when ``need`` bytes exceed what ``backend`` (the host by default) can still
    give, before any of it is allocated or touched."""
    free = backend.memory_available() if backend is not None else host_memory_available()
    if free is not None and need > free:
        where = "GPU memory" if backend is not None and backend.xp is not np else "memory"
        raise MemoryError(f"{what} needs about {format_bytes(need)}, more than the {format_bytes(free)} of {where} "
                          f"available")


def format_bytes(n: float) -> str:
    """``n`` bytes for people: 512 B, 7.4 KiB, 152.6 MiB, 37.3 GiB, 3.6 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n):,} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
