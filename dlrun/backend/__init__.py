"""The device wing: numpy or CuPy (:mod:`.backend`, the only code that imports cupy), the CUDA
kernels dlrun declares (here), memory left (:mod:`.memory`), the flat parameter buffer
(:mod:`.arena`), scratch buffers (:mod:`.buffers`) and BLAS threads (:mod:`.threads`).
"""
from __future__ import annotations

import numpy as np

from .backend import CPU, DEVICES, Backend, Captured, array_module, get_backend, gpu_available, to_host, upload
from .memory import ensure_fits, format_bytes, host_memory_available

__all__ = ["CPU", "DEVICES", "Backend", "Captured", "upload", "array_module", "get_backend", "gpu_available", "to_host", "ensure_fits",
           "format_bytes", "host_memory_available", "KERNELS", "Kernel", "out_args"]

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
