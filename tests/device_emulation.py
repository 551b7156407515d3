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

:func:`emulated_gpu`'s stand-in also captures CUDA graphs as CuPy's stream capture does
(``Stream.begin_capture`` / ``end_capture``, ``Graph.launch``): while capturing, every device
operation (a ufunc or a reduction, an array method or function that computes on the device, an
indexed read or write, a generator's draw, a fused kernel of tests/kernel_emulation.py) is
recorded with its arguments as they are then, its effects are undone at the end of the capture
(a capture runs nothing), and a launch re-executes the recorded operations alone. A Python
value that changes between steps but was passed as an argument at capture time (a learning
rate, a step count), or host work that a step needs, is then missing from the replays, and the
replayed training drifts from the uncaptured one; a host read or a host-to-device copy while
capturing raises, as in CuPy.

What this cannot see: ``np.asarray(x)`` of a device array (numpy gives ndarray subclasses no
hook; CuPy raises TypeError there), and CuPy's own launch and memory behaviour.
"""
from __future__ import annotations

import os
import sys
import traceback
import types
from contextlib import contextmanager

import numpy as np

import dlrun
from dlrun.backend import Backend, gemm

_DLRUN = os.path.dirname(dlrun.__file__) + os.sep


class HostRead(AssertionError):
    """A read from the device, or a synchronisation, where none may happen."""


_guard = {"on": False}
# every read from the device (or synchronisation) the stand-in has seen, allowed or not, as
# (what, the traceback's frames), while a ``counting_host_reads`` block is open
_reads: dict = {"log": None}


def _host_read(what: str) -> None:
    if _guard["on"]:
        raise HostRead(f"the host waits for the device: {what}")
    log = _reads["log"]
    if log is not None:
        log.append((what, traceback.extract_stack()[:-2]))


@contextmanager
def counting_host_reads():
    """Within it, every read from the device and every synchronisation is listed: yields the
    list of ``(what, stack)`` it fills (a stack: traceback.extract_stack's frames)."""
    before, log = _reads["log"], []
    _reads["log"] = log
    try:
        yield log
    finally:
        _reads["log"] = before


@contextmanager
def no_host_reads():
    """Within it, anything that would make the host wait for the GPU raises HostRead."""
    before = _guard["on"]
    _guard["on"] = True
    try:
        yield
    finally:
        _guard["on"] = before


# CuPy's arithmetic operators run their kernel directly only when the right operand is a CuPy
# array (or the left one a Python number: ``2 * x``), and in place (``x *= 2``). ``x * 2``,
# ``x > 0``, a numpy scalar on either side, or a numpy ufunc called on a device array goes through
# numpy's ufunc dispatch to ``cupy.ndarray.__array_ufunc__`` instead: slower per call, and its
# first call imports cupyx.scipy.special and with it SciPy, a fifth of a second of every GPU
# run's start. The stand-in notes each such call (where dlrun made it) in ``dispatches``.
_dispatch = {"direct": 0, "seen": []}


def numpy_dispatches() -> list[str]:
    """Where the emulated device arrays went through numpy's ufunc dispatch, since the last clear."""
    return list(_dispatch["seen"])


def clear_numpy_dispatches() -> None:
    _dispatch["seen"].clear()


def _note_dispatch(ufunc) -> None:
    frame = sys._getframe(2)
    while frame is not None and not frame.f_code.co_filename.startswith(_DLRUN):
        frame = frame.f_back
    if frame is not None:  # (only dlrun's own calls; a test's ``x * 2`` is its own business)
        where = f"{os.path.relpath(frame.f_code.co_filename, _DLRUN)}:{frame.f_lineno} {ufunc.__name__}"
        _dispatch["seen"].append(where)


@contextmanager
def _direct():
    _dispatch["direct"] += 1
    try:
        yield
    finally:
        _dispatch["direct"] -= 1


class CaptureError(RuntimeError):
    """What CUDA stream capture refuses (a host-to-device copy while capturing, say)."""


# the capture under way: its recorded operations, the arrays it wrote (saved as they were), the
# generators it drew from (their states before); depth > 0 inside a recorded operation
_capture = {"ops": None, "saved": None, "rngs": None, "depth": 0, "direct": False}  # direct: inside _direct_gemm


def capturing() -> bool:
    return _capture["ops"] is not None


# CuPy checks the stream before every cuBLAS call and refuses one that is being captured (its
# cublas.setStream); these products go to cuBLAS there. dlrun.backend.gemm's direct route, which a
# captured step takes instead, runs as _direct_gemm here.
_CUBLAS = {"matmul", "dot", "vdot", "inner", "tensordot", "einsum"}


def _refuse_cublas(name: str) -> None:
    if _capture["ops"] is not None and not _capture["depth"] and not _capture["direct"]:
        raise NotImplementedError(f"calling cuBLAS API during stream capture is currently unsupported ({name})")


def _direct_gemm(xp, a, b, out=None):
    """dlrun.backend.gemm.matmul on the stand-in: one recorded product, allowed while capturing."""
    _capture["direct"] = True
    try:
        return FAKE_CUPY.matmul(a, b, out=out)
    finally:
        _capture["direct"] = False


@contextmanager
def _inside():
    """The device operations an operation makes of its own are part of it, not recorded."""
    _capture["depth"] += 1
    try:
        yield
    finally:
        _capture["depth"] -= 1


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def will_write(*arrays) -> None:
    """Before an operation writes ``arrays`` in place while capturing: keep them as they were,
    to be put back when the capture ends (a capture computes nothing)."""
    if _capture["ops"] is None or _capture["depth"]:
        return
    saved = _capture["saved"]
    for a in arrays:
        if isinstance(a, np.ndarray):
            r = _root(a)
            if id(r) not in saved:
                saved[id(r)] = (r, np.array(r, copy=True))


def _record(replay) -> None:
    """Keep ``replay`` (re-executes one device operation) while capturing at the top level."""
    if _capture["ops"] is not None and not _capture["depth"]:
        _capture["ops"].append(replay)


def record_call(f, args, kwargs, result) -> None:
    """Record a call whose result, a new device array, is refreshed by each replay (what it
    writes in place was announced with :func:`will_write`); a result that shares memory with an
    argument is a view, which needs no refreshing."""
    if _capture["ops"] is None or _capture["depth"]:
        return
    fresh = isinstance(result, np.ndarray) and not any(
        isinstance(a, np.ndarray) and np.shares_memory(result, a) for a in (*args, *kwargs.values()))

    def replay():
        with _inside():
            again = f(*args, **kwargs)
        if fresh:
            result.view(np.ndarray)[...] = _plain(again)

    _record(replay)


def _host_array(a) -> bool:
    return isinstance(a, np.ndarray) and not isinstance(a, DeviceArray) and a.ndim > 0


def _host_index(key) -> bool:
    return any(isinstance(k, list) or _host_array(k) for k in (key if isinstance(key, tuple) else (key,)))


def _host_data(a) -> bool:
    if isinstance(a, DeviceArray):
        return False
    if isinstance(a, (list, tuple)):
        return any(_host_data(v) for v in a)
    return isinstance(a, (np.ndarray, np.generic, int, float, complex, bool))


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

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if not _dispatch["direct"] and not _capture["depth"]:
            _note_dispatch(ufunc)
        if ufunc is np.matmul:
            _refuse_cublas("matmul")
        if capturing() and not _capture["depth"] and any(_host_array(a) for a in inputs):
            raise CaptureError(f"a host array passed to {ufunc.__name__} while capturing (CuPy refuses numpy arrays)")
        args = tuple(_plain(a) for a in inputs)
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
            will_write(*kwargs["out"])
        if method == "at":
            will_write(args[0])
        with _inside():
            result = getattr(ufunc, method)(*args, **kwargs)
        if method == "at":
            _record(lambda: getattr(ufunc, method)(*args, **kwargs))
            return None
        if out is not None:
            results = tuple(out)
        else:
            many = isinstance(result, tuple)
            results = tuple(np.asarray(r).view(DeviceArray) for r in (result if many else (result,)))
            kwargs = {**kwargs, "out": tuple(r.view(np.ndarray) for r in results)}
        _record(lambda: getattr(ufunc, method)(*args, **kwargs))
        return results if len(results) > 1 else results[0]

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ in _CUBLAS:
            _refuse_cublas(func.__name__)
        will_write(*[kwargs[k] for k in ("out", "dst") if isinstance(kwargs.get(k), np.ndarray)])
        if func in (np.copyto, np.put, np.place, np.putmask, np.fill_diagonal) and args:
            will_write(args[0])
        with _inside(), _direct():  # (CuPy's __array_function__ calls its own function)
            result = _dev(super().__array_function__(func, types, args, kwargs))
        record_call(func, args, kwargs, result)
        return result

    def _operator(name, direct_when):
        f = getattr(np.ndarray, name)

        def call(self, *args, **kwargs):
            if direct_when(args[0] if args else None):
                with _direct():
                    return f(self, *args, **kwargs)
            return f(self, *args, **kwargs)  # through numpy's ufunc dispatch, as in CuPy
        call.__name__ = name
        return call

    # x OP y: CuPy's kernel directly when y is a CuPy array; x ** 2, ** 0.5, ** -1.0 too
    for _name in ("__add__", "__sub__", "__mul__", "__matmul__", "__truediv__", "__floordiv__", "__mod__",
                  "__divmod__", "__lshift__", "__rshift__", "__and__", "__or__", "__xor__",
                  "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
        locals()[_name] = _operator(_name, lambda y: isinstance(y, DeviceArray))
    __pow__ = _operator("__pow__", lambda y: isinstance(y, DeviceArray) or (type(y) is int and y == 2)
                        or (type(y) is float and y in (0.5, 2.0, -1.0)))
    # y OP x with a Python number y (CuPy's operator slot gets it first); a numpy scalar or array on
    # the left is numpy's operator, which dispatches
    for _name in ("__radd__", "__rsub__", "__rmul__", "__rmatmul__", "__rtruediv__", "__rfloordiv__", "__rmod__",
                  "__rdivmod__", "__rpow__", "__rlshift__", "__rrshift__", "__rand__", "__ror__", "__rxor__"):
        locals()[_name] = _operator(_name, lambda y: isinstance(y, DeviceArray) or type(y) in (int, float, bool, complex))
    # in place, unary, and the array methods that reduce or compute: CuPy's own kernels
    for _name in ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                  "__ilshift__", "__irshift__", "__iand__", "__ior__", "__ixor__", "__neg__", "__pos__", "__abs__",
                  "__invert__", "sum", "mean", "max", "min", "prod", "all", "any", "std", "var", "clip", "round",
                  "conj", "ptp"):
        if hasattr(np.ndarray, _name):
            locals()[_name] = _operator(_name, lambda y: True)
    del _name, _operator

    def __getitem__(self, key):
        if _is_mask(key):
            _host_read("x[mask] (CuPy reads the number of selected elements back)")
        if capturing() and not _capture["depth"] and _host_index(key):
            raise CaptureError("a host index array (a list or numpy array) copied to the device while capturing")
        with _inside():
            result = _dev(super().__getitem__(key))
        if capturing() and not (isinstance(result, np.ndarray) and np.shares_memory(result, self)):
            plain, k = self.view(np.ndarray), _plain_key(key)
            _record(lambda: result.view(np.ndarray).__setitem__(..., plain[k]))
        return result

    def __setitem__(self, key, value):
        # CuPy copies a device value into place on the device (numpy would call float() on a 0-d one)
        if capturing() and isinstance(value, (np.ndarray, list, tuple)) and _host_data(value):
            raise CaptureError("a host array copied to the device while capturing")
        if capturing() and not _capture["depth"] and _host_index(key):
            raise CaptureError("a host index array (a list or numpy array) copied to the device while capturing")
        plain, k, v = self.view(np.ndarray), _plain_key(key), _plain(value)
        will_write(plain)
        with _inside():
            plain[k] = v
        _record(lambda: plain.__setitem__(k, v))

    def set(self, arr, stream=None):
        """cupy.ndarray.set: an asynchronous host-to-device copy (refused while capturing)."""
        if capturing():
            raise CaptureError("the current stream is capturing, so H2D transfers are disallowed")
        self.view(np.ndarray)[...] = arr

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

    def _method(name):
        def call(self, *args, **kwargs):
            f = getattr(np.ndarray, name)
            if name in _CUBLAS:
                _refuse_cublas(f"x.{name}")
            if name in _IN_PLACE:
                will_write(self)
            with _inside():
                result = _dev(f(self, *args, **kwargs))
            record_call(f, (self, *args), kwargs, result)
            return result
        call.__name__ = name
        return call

    # the array methods that compute in C without a ufunc (ufuncs and reductions are recorded above)
    for _name in ("astype", "copy", "argmax", "argmin", "take", "cumsum", "cumprod", "dot", "fill", "sort",
                  "argsort", "put", "repeat", "ravel", "flatten", "reshape", "choose", "searchsorted",
                  "diagonal", "trace", "partition"):
        locals()[_name] = _method(_name)
    del _name, _method

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None and not blocking:  # queued into page-locked memory: the host goes on
            if not isinstance(out.base, _Pinned):
                raise AssertionError("x.get(out=..., blocking=False) into memory that is not page-locked: "
                                     "CuPy copies synchronously then")
            plain = self.view(np.ndarray)
            will_write(out)  # (a capture records the copy: each replay makes it)
            np.copyto(out, plain)
            _record(lambda: np.copyto(out, plain))
            return out
        _host_read("x.get()")
        if out is not None:
            np.copyto(out, self.view(np.ndarray))
            return out
        return np.array(self, copy=True).view(np.ndarray)

    def __repr__(self):
        _host_read("repr(x)")
        return "device" + repr(np.asarray(self))

    def __str__(self):
        _host_read("str(x)")
        return str(np.asarray(self))

    def __format__(self, spec):
        _host_read("format(x)")
        return format(np.asarray(self), spec)


_IN_PLACE = {"fill", "sort", "put", "partition"}


def _plain_key(key):
    if isinstance(key, tuple):
        return tuple(_plain(k) for k in key)
    return _plain(key)


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
        if name in _CUBLAS:
            _refuse_cublas(name)
        if syncing:
            _host_read(syncing)
        if name == "where" and len(args) == 1 and not kwargs:
            _host_read("where(cond) with one argument (the count is read back)")
        if capturing() and name in ("asarray", "array", "ascontiguousarray") and _host_data(args[0] if args else None):
            raise CaptureError(f"{name} of host data copies it to the device while capturing")
        if isinstance(kwargs.get("out"), np.ndarray):
            will_write(kwargs["out"])
        with _inside(), _direct():
            result = _dev(f(*args, **kwargs))
        if name not in _NO_KERNEL:
            record_call(f, args, kwargs, result)
        return result

    call.__name__ = name
    return call


_NO_KERNEL = {"empty", "empty_like"}  # an allocation alone: nothing runs on the device


class _Generator:
    """cupy.random.Generator: draws land on the device, and its state lives there (each draw
    advances it on the device, so a replayed draw gives new numbers, as CuPy's does)."""

    def __init__(self, seed):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_g":  # (copy.deepcopy probes for hooks before _g exists)
            raise AttributeError(name)
        draw = _wrap(name, getattr(self._g, name))

        def call(*args, **kwargs):
            rngs = _capture["rngs"]
            if rngs is not None and id(self._g) not in rngs:
                rngs[id(self._g)] = (self._g, self._g.bit_generator.state)
            return draw(*args, **kwargs)

        return call


def _asnumpy(a, *args, **kwargs):
    _host_read("asnumpy(x)")
    return np.array(a, copy=True).view(np.ndarray)


class _Pinned(bytearray):
    """What cupy.cuda.alloc_pinned_memory gives: page-locked host memory (here a plain buffer)."""


class _Device:
    def synchronize(self):
        _host_read("Device().synchronize()")


class _Event:
    pass


class _Graph:
    """cupy.cuda.Graph: the operations a capture recorded; launch re-executes them in order."""

    def __init__(self, ops):
        self.ops, self.launches = ops, 0

    def launch(self, stream=None):
        if capturing():
            raise CaptureError("a graph launched while capturing")
        for op in self.ops:
            op()
        self.launches += 1


class _Stream:
    """cupy.cuda.Stream, with stream capture (begin_capture / end_capture)."""

    captures = 0  # graphs captured since the stand-in was made (for tests)

    def __init__(self, null=False, non_blocking=False):
        self.null = null

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def record(self, event=None):
        return event or _Event()

    def wait_event(self, event):
        pass

    def synchronize(self):
        _host_read("Stream.synchronize()")

    def begin_capture(self, mode=None):
        if self.null:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if capturing():
            raise CaptureError("a capture is already under way")
        _capture.update(ops=[], saved={}, rngs={}, guard=_guard["on"])
        _guard["on"] = True  # CUDA refuses a synchronisation while capturing

    def end_capture(self):
        ops, saved, rngs = _capture["ops"], _capture["saved"], _capture["rngs"]
        _guard["on"] = _capture.pop("guard")
        _capture.update(ops=None, saved=None, rngs=None)
        for root, before in saved.values():  # a capture runs nothing: undo what recording computed
            root[...] = before
        for g, state in rngs.values():
            g.bit_generator.state = state
        _Stream.captures += 1
        return _Graph(ops)


_NULL_STREAM = _Stream(null=True)


class _MemoryPool:
    def malloc(self, size):
        return None

    def free_all_blocks(self):
        pass

    def total_bytes(self):
        return 0


@contextmanager
def _using_allocator(allocator=None):
    yield


class _Ufunc:
    """cupy.add and its kind: CuPy's own ufuncs, called directly (no numpy dispatch)."""

    def __init__(self, ufunc):
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        with _direct():
            return self._ufunc(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._ufunc, name)
        if name not in ("reduce", "accumulate", "at", "outer", "reduceat"):
            return attr

        def call(*args, **kwargs):
            with _direct():
                return attr(*args, **kwargs)
        return call


class FakeCupy(types.ModuleType):
    """numpy behind CuPy's name: functions return DeviceArrays; ufuncs and dtypes pass through."""

    def __init__(self):
        super().__init__("cupy_emulated")
        self.ndarray = DeviceArray
        self.asnumpy = _asnumpy
        self.get_default_memory_pool = _MemoryPool
        self.random = types.SimpleNamespace(default_rng=_Generator)
        self.cuda = types.SimpleNamespace(Device=_Device, alloc_pinned_memory=_Pinned, Stream=_Stream,
                                          MemoryPool=_MemoryPool,
                                          using_allocator=_using_allocator,
                                          get_current_stream=lambda: _NULL_STREAM,
                                          runtime=types.SimpleNamespace(is_hip=False))
        # a strided view of a device array is a device array (numpy's as_strided drops the subclass)
        as_strided = np.lib.stride_tricks.as_strided
        self.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
            as_strided=lambda x, *args, **kwargs: _dev(as_strided(x, *args, **kwargs))))

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):  # DeviceArray keeps their outputs on the device
            wrapped = _Ufunc(attr)
            setattr(self, name, wrapped)
            return wrapped
        if isinstance(attr, (type, types.ModuleType)) or not callable(attr):
            return attr  # dtypes, constants
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
        m.setattr(gemm, "matmul", _direct_gemm)
        yield Backend("gpu", FAKE_CUPY)
