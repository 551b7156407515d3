"""Where the checked code runs. The checker draws points, keeps snapshots and compares on the
host (numpy, float64); the layer, loss or regularizer reads arrays on its device, and every
finite-difference perturbation is written into those device arrays.

On the CPU both sides are the same numpy arrays and nothing is copied. On the GPU (CuPy),
``put`` is a host-to-device copy and ``host`` a device-to-host copy; the check synchronises on
every element it perturbs, which is slow but exact, and fine for the small shapes checked.
"""
from __future__ import annotations

import os

import numpy as np

from ..backend import Backend, get_backend, to_host

TF32_WARNING = ("CUPY_TF32 is set: CuPy computes float32 matmuls in TF32 (10-bit mantissa), whose "
                "rounding can fail correct layers; unset it, or check in float64 (unaffected)")


class Device:
    """A backend plus the host <-> device moves the checker needs."""

    def __init__(self, backend: Backend):
        self.backend = backend

    @property
    def name(self) -> str:
        return self.backend.name

    def put(self, a):
        """A host array (or None) on the device; on the CPU the same array, no copy."""
        return None if a is None else self.backend.asarray(a)

    def host(self, a):
        """A device array (or None) as a new numpy array that never aliases it."""
        return None if a is None else np.array(to_host(a), copy=True)

    def assign(self, arr, values) -> None:
        """Write host ``values`` into the device array ``arr`` in place (cast to its dtype)."""
        arr[...] = self.put(np.asarray(values, dtype=arr.dtype))


def open_device(name: str) -> Device:
    """The device ``name`` ('cpu' or 'gpu'); BackendError, one line, when it cannot be used."""
    return Device(get_backend(name))


def warnings_for(device: str, dtype: str) -> list[str]:
    """Device-specific cautions for the report header."""
    try:
        tf32 = int(os.environ.get("CUPY_TF32", "0")) > 0  # CuPy's own test of the variable
    except ValueError:
        tf32 = False
    return [TF32_WARNING] if device == "gpu" and dtype == "float32" and tf32 else []
