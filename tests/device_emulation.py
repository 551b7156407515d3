"""A stand-in for CuPy on the CPU that refuses what would make the host wait for the GPU.

On a GPU, dlrun's training step only queues work: a device-to-host read (``float(x)``,
``x.item()``, ``asnumpy``, ``if x:``) or a call that CuPy can only answer by reading the device
first (``bincount``, ``nonzero``, ``unique``, ``x[mask]``) makes the host wait until the GPU
has finished everything before it. That costs nothing visible on a CPU and a lot on a GPU, and
tests/backend/test_gpu.py can only see it on a machine with one.

:func:`emulated_gpu` gives a ``Backend('gpu', ...)`` whose array module is :data:`FAKE_CUPY`:
numpy underneath, but every array it makes is a :class:`DeviceArray`, an ndarray that behaves
like a CuPy array where it matters here (reductions and indexing give 0-d arrays, not host
scalars) and that raises :class:`HostRead` for any of the above inside :func:`no_host_reads`.
With tests/kernel_emulation.py's ``emulate`` active as well, every fused kernel runs its numpy
emulator, so the step takes the GPU branches throughout.

What this cannot see: ``np.asarray(x)`` of a device array (numpy gives ndarray subclasses no
hook; CuPy raises TypeError there), and CuPy's own launch and memory behaviour.
"""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import numpy as np

from dlrun.backend import Backend


class HostRead(AssertionError):
    """A read from the device, or a synchronisation, where none may happen."""


_guard = {"on": False}


def _host_read(what: str) -> None:
    if _guard["on"]:
        raise HostRead(f"the host waits for the device: {what}")


@contextmanager
def no_host_reads():
    """Within it, anything that would make the host wait for the GPU raises HostRead."""
    before = _guard["on"]
    _guard["on"] = True
    try:
        yield
    finally:
        _guard["on"] = before


def _dev(a):
    """``a`` (an array, a scalar, or a tuple or list of them) on the emulated device."""
    if isinstance(a, DeviceArray):
        return a
    if isinstance(a, np.ndarray):
        return a.view(DeviceArray)
    if isinstance(a, np.generic):
        return np.asarray(a).view(DeviceArray)
    if isinstance(a, tuple):
        return tuple(_dev(v) for v in a)
    if isinstance(a, list):
        return [_dev(v) for v in a]
    return a


def _is_mask(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and k.dtype == np.bool_ and k.ndim > 0 for k in keys)


class DeviceArray(np.ndarray):
    """An array on the emulated device (see the module's docstring)."""

    def __array_wrap__(self, arr, context=None, return_scalar=False):
        # CuPy's reductions give 0-d device arrays; numpy would give a host scalar
        return np.asarray(arr).view(DeviceArray)

    def __getitem__(self, key):
        if _is_mask(key):
            _host_read("x[mask] (CuPy reads the number of selected elements back)")
        return _dev(super().__getitem__(key))

    def __setitem__(self, key, value):
        # CuPy copies a device value into place on the device (numpy would call float() on a 0-d one)
        super().__setitem__(key, value.view(np.ndarray) if isinstance(value, DeviceArray) else value)

    def __float__(self):
        _host_read("float(x)")
        return float(np.asarray(self))

    def __int__(self):
        _host_read("int(x)")
        return int(np.asarray(self))

    def __index__(self):
        _host_read("x used as an index (operator.index)")
        return np.asarray(self).__index__()

    def __bool__(self):
        _host_read("bool(x) (an if or while on a device value)")
        return bool(np.asarray(self))

    def __complex__(self):
        _host_read("complex(x)")
        return complex(np.asarray(self))

    def item(self, *args):
        _host_read("x.item()")
        return np.asarray(self).item(*args)

    def tolist(self):
        _host_read("x.tolist()")
        return np.asarray(self).tolist()

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None and not blocking:  # queued into page-locked memory: the host goes on
            if not isinstance(out.base, _Pinned):
                raise AssertionError("x.get(out=..., blocking=False) into memory that is not page-locked: "
                                     "CuPy copies synchronously then")
            np.copyto(out, self.view(np.ndarray))
            return out
        _host_read("x.get()")
        if out is not None:
            np.copyto(out, self.view(np.ndarray))
            return out
        return np.array(self, copy=True).view(np.ndarray)

    def set(self, arr, stream=None):
        np.copyto(self.view(np.ndarray), arr)

    def __repr__(self):
        _host_read("repr(x)")
        return "device" + repr(np.asarray(self))

    def __str__(self):
        _host_read("str(x)")
        return str(np.asarray(self))

    def __format__(self, spec):
        _host_read("format(x)")
        return format(np.asarray(self), spec)


# CuPy functions whose output size or value needs a read of device data before they return
_SYNCING = {
    "bincount": "bincount (CuPy reads max(x) back to size its output)",
    "nonzero": "nonzero (the count is read back)", "flatnonzero": "flatnonzero (the count is read back)",
    "argwhere": "argwhere (the count is read back)", "unique": "unique (the count is read back)",
    "compress": "compress (the count is read back)", "extract": "extract (the count is read back)",
}


def _wrap(name, f):
    syncing = _SYNCING.get(name)

    def call(*args, **kwargs):
        if syncing:
            _host_read(syncing)
        if name == "where" and len(args) == 1 and not kwargs:
            _host_read("where(cond) with one argument (the count is read back)")
        return _dev(f(*args, **kwargs))

    call.__name__ = name
    return call


class _Generator:
    """cupy.random.Generator: draws land on the device."""

    def __init__(self, seed):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        return _wrap(name, getattr(self._g, name))


def _asnumpy(a, *args, **kwargs):
    _host_read("asnumpy(x)")
    return np.array(a, copy=True).view(np.ndarray)


class _Pinned(bytearray):
    """What cupy.cuda.alloc_pinned_memory gives: page-locked host memory (here a plain buffer)."""


class _Device:
    def synchronize(self):
        _host_read("Device().synchronize()")


class FakeCupy(types.ModuleType):
    """numpy behind CuPy's name: functions return DeviceArrays; ufuncs and dtypes pass through."""

    def __init__(self):
        super().__init__("cupy_emulated")
        self.ndarray = DeviceArray
        self.asnumpy = _asnumpy
        self.random = types.SimpleNamespace(default_rng=_Generator)
        self.cuda = types.SimpleNamespace(Device=_Device, alloc_pinned_memory=_Pinned)

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, (type, np.ufunc, types.ModuleType)) or not callable(attr):
            return attr  # dtypes, ufuncs (DeviceArray keeps their outputs on the device), constants
        wrapped = _wrap(name, attr)
        setattr(self, name, wrapped)
        return wrapped


FAKE_CUPY = FakeCupy()
DeviceArray.__module__ = "cupy_emulated"  # dlrun.backend.array_module sees a CuPy-like array


@contextmanager
def emulated_gpu(monkeypatch):
    """A GPU backend on the CPU (with sys.modules['cupy'] pointing at the stand-in, as
    dlrun.backend.array_module looks it up there)."""
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "cupy", FAKE_CUPY)
        yield Backend("gpu", FAKE_CUPY)
