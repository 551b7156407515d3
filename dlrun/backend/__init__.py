"""The device wing: numpy or CuPy (:mod:`.backend`, the only code that imports cupy), the CUDA
kernels dlrun declares (here), memory left (:mod:`.memory`), the flat parameter buffer
(:mod:`.arena`), scratch buffers (:mod:`.buffers`) and BLAS threads (:mod:`.threads`).
"""
from __future__ import annotations

import numpy as np

from .backend import CPU, DEVICES, Backend, Captured, array_module, get_backend, gpu_available, to_host, upload
from .memory import ensure_fits, format_bytes, host_memory_available

__all__ = ["CPU", "DEVICES", "Backend", "Captured", "upload", "array_module", "get_backend", "gpu_available", "to_host", "ensure_fits",
           "format_bytes", "host_memory_available", "KERNELS", "Kernel", "out_args", "BLOCK_KERNELS",
           "BlockKernel", "Launch"]

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


BLOCK_KERNELS: list = []  # every block kernel dlrun declares, in import order
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


class BlockKernel:
    """A CUDA kernel written in full (a ``cupy.RawKernel``), declared once and built on first GPU use.

    Where an elementwise kernel cannot hold the work (threads that cooperate through shared
    memory and barriers, a loop over time steps inside one launch), the source is a complete
    ``extern "C" __global__`` function named ``name``, written for a float type ``T``: it is
    built once per dtype with ``typedef float T;`` or ``typedef double T;`` ahead of it. Every
    source sits in :data:`BLOCK_KERNELS`, so a test compiles each for both floats with NVRTC.
    """

    def __init__(self, source: str, name: str):
        if any(k.name == name for k in BLOCK_KERNELS + KERNELS):
            raise ValueError(f"a kernel named {name!r} is already declared")
        self.source, self.name = source, name
        self._built: dict = {}
        BLOCK_KERNELS.append(self)

    def __repr__(self) -> str:
        return f"BlockKernel({self.name!r})"

    def code(self, dtype) -> str:
        """The CUDA source for float type ``dtype`` (float32 or float64)."""
        return f"typedef {_CTYPES[np.dtype(dtype)]} T;\n" + self.source

    def on(self, xp, dtype):
        """A :class:`Launch` of the kernel for ``dtype`` when ``xp`` is CuPy and ``dtype`` float32
        or float64, else None (the caller keeps its other path)."""
        key = np.dtype(dtype)
        if xp is np or key not in _CTYPES:
            return None
        if key not in self._built:
            self._built[key] = xp.RawKernel(self.code(key), self.name)
        return Launch(self._built[key])


class Launch:
    """Runs a built block kernel: ``blocks`` blocks of threads for ``work`` items each.

    The block is ``work`` rounded up to whole warps of 32, but never more threads than the
    compiled kernel allows (``max_threads_per_block``, which its registers decide): a kernel
    launched through here must loop over its items with a stride of ``blockDim.x``. Python ints
    among the arguments are passed as 32-bit ``int``, as the kernels declare them. No blocks (an
    empty batch) is no launch: CUDA refuses a grid of 0.
    """

    def __init__(self, kernel):
        self.kernel = kernel

    def threads(self, work: int) -> int:
        """The threads per block for ``work`` items a block."""
        limit = self.kernel.max_threads_per_block
        return min(-(-max(work, 1) // 32) * 32, limit // 32 * 32 if limit >= 32 else limit)

    def __call__(self, blocks: int, work: int, *args) -> None:
        if blocks == 0:
            return
        args = tuple(np.int32(a) if isinstance(a, int) else a for a in args)
        self.kernel((blocks,), (self.threads(work),), args)
