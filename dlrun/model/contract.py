"""What a component's code must return, checked on its first call (the layer contract of
``layers/base.py``, and what losses, regularizers and optimizers promise the trainer), and how a
failure is named: the component, the call and the file:line of its source.

Sequential checks each layer's first forward and backward; the trainer checks its first step.
Later calls skip the checks, so the per-batch path pays nothing for them.
"""
from __future__ import annotations

import inspect
import os
import re
import traceback

import numpy as np

from ..backend import array_module
from ..errors import LayerError, ShapeError
from ..registry.plugins import blame, raised_elsewhere


def loose_arrays(layer) -> dict:
    """The float arrays a layer keeps as public attributes outside its parameters and declared
    state (neon-style ``self.W``; running statistics kept as plain attributes), by name: nothing
    trains, checks or saves them."""
    skip = {"training", "rng", "backend", "xp", "dtype", "params", "spec", *layer.state}
    owned = {id(a) for p in layer.params.values() for a in (p.data, p.grad) if a is not None}
    return {k: v for k, v in vars(layer).items()
            if not k.startswith("_") and k not in skip and hasattr(v, "shape") and hasattr(v, "dtype")
            and getattr(v.dtype, "kind", "") == "f" and id(v) not in owned}


class GlobalDraws:
    """Whether a layer's build drew from numpy's global generator (``np.random.randn``), made
    before the build: such values differ in every process, whatever the run's seed."""

    def __init__(self):
        _, keys, pos, *_ = np.random.get_state()
        self._before = keys.copy(), pos

    def unsaved(self, layer) -> str | None:
        """Why the built ``layer`` cannot be saved and restored, or None: it drew from the global
        generator and keeps float arrays outside its parameters (a checkpoint holds neither, so
        evaluate and predict would rebuild other values)."""
        _, keys, pos, *_ = np.random.get_state()
        if np.array_equal(keys, self._before[0]) and pos == self._before[1]:
            return None
        loose = loose_arrays(layer)
        if not loose:
            return None
        names = ", ".join(f"{k} {tuple(v.shape)}" for k, v in loose.items())
        return (f"build drew {names} from numpy's global random generator (np.random.*) and keeps it outside "
                f"the layer's parameters: it is not trained, and not saved in checkpoints, so evaluate and predict "
                f"would draw other values; create it with self.add_param(name, shape, initializer) "
                f"(trainable=False for a fixed random matrix)")


def output_shape(layer, out, given) -> tuple[int, ...]:
    """What ``build`` returned, checked: a tuple of sizes >= 1 (ShapeError otherwise, which the
    caller locates), so a layer that cannot take its input is named, not the layer after it."""
    name = type(layer).__name__
    try:  # a tuple, a list, an integer array (np.array(input_shape) // 2): any sequence of sizes
        sizes = None if isinstance(out, (str, bytes, dict)) else list(out)
    except TypeError:
        sizes = None
    if sizes is None:
        raise ShapeError(f"{name}: build returned {out!r} ({type(out).__name__}); it must return the per-sample "
                         f"output shape as a tuple, e.g. (units,)")
    out = sizes
    try:
        shape = tuple(int(d) for d in out)
    except (TypeError, ValueError):
        raise ShapeError(f"{name}: build returned {tuple(out)!r}; every size must be an integer") from None
    if any(d < 1 or d != s for d, s in zip(shape, out)):
        raise ShapeError(f"{name}: build returned the output shape {shape} for input of shape {given}; every "
                         f"size must be an integer >= 1 (is the input too small for the layer's options?)")
    return shape


# -- every element of a gradient written: the gradients are filled with the dtype's largest value
# before a checked backward; max + g rounds back to max for any ordinary g, so an element left
# unwritten or added to (+=) keeps it, while a NaN that flowed in from dy is not mistaken for it

UNWRITTEN_HINT = ("it must set the whole gradient of this batch (p.grad[...] = ..., not p.grad += ...: nothing "
                  "zeroes it between steps)")


def mark_unwritten(arrays) -> None:
    """Fill each float array (a parameter gradient; None and others are skipped) with its dtype's
    largest value, before the backward whose writes :func:`unwritten` then counts."""
    for a in arrays:
        if getattr(a, "dtype", None) is not None and a.dtype.kind == "f":
            a.fill(np.finfo(a.dtype).max)


def unwritten(a) -> int:
    """How many elements of float array ``a`` still hold :func:`mark_unwritten`'s value."""
    if getattr(a, "dtype", None) is None or a.dtype.kind != "f":
        return 0
    xp = array_module(a)
    return int(xp.count_nonzero(xp.equal(a, np.finfo(a.dtype).max)))


def blame_other(e: BaseException, layer):
    """A PluginRaised for ``e`` when plugin code other than ``layer``'s own raised it (a plugin
    initializer that a built-in layer called), else None (a helper in the layer's own file is
    the layer's code)."""
    return blame(e) if raised_elsewhere(e, layer) else None


def layer_raised(layers, e: Exception, call: str, label=None) -> Exception:
    """A LayerError naming the layer whose ``call`` raised ``e`` and the line of its source file
    the exception came from; ``e`` itself when no layer's frame is in the traceback. Found from
    the traceback, so the calling loops carry no bookkeeping."""
    tb = e.__traceback__
    while tb is not None and not any(tb.tb_frame.f_locals.get("self") is layer for layer in layers):
        tb = tb.tb_next
    if tb is None:
        return e
    layer = tb.tb_frame.f_locals["self"]
    i = next(i for i, other in enumerate(layers) if other is layer)
    return LayerError(f"{label(i) if label else f'model[{i}]'} {layer!r}: {call} raised {type(e).__name__}: {e}{source_line(layer, e)}")


def source_line(component, error: BaseException) -> str:
    """' (file.py:LINE)' of the innermost traceback frame in ``component``'s source file, or '';
    then a hint when numpy's message shows a transposed gradient (see :func:`transposed`)."""
    try:
        source = os.path.realpath(inspect.getsourcefile(type(component)) or "")
    except TypeError:
        return transposed(error)
    lines = [f for f in traceback.extract_tb(error.__traceback__) if os.path.realpath(f.filename) == source]
    return (f" ({os.path.basename(source)}:{lines[-1].lineno})" if lines else "") + transposed(error)


_PACKAGE = os.path.dirname(os.path.realpath(__file__))


def defined_at(component, call: str) -> str:
    """' (file.py:LINE)' of the ``def`` of method ``call`` of ``component``'s class, or of the class
    when the method is inherited from dlrun (a plugin layer that overrides only build): where a
    user looks when that method broke its contract; '' for dlrun's own code."""
    cls = type(component)
    for obj in (getattr(cls, call, None), cls):
        obj = getattr(obj, "__func__", obj)
        try:
            file = os.path.realpath(inspect.getsourcefile(obj) or "")
            line = inspect.getsourcelines(obj)[1] if file else None
        except (TypeError, OSError):
            continue
        if line and not file.startswith(_PACKAGE + os.sep):
            return f" ({os.path.basename(file)}:{line})"
    return ""


_BROADCAST = re.compile(r"from shape \((\d+),(\d+)\) into shape \((\d+),(\d+)\)")


TRANSPOSED = "a transposed gradient (xᵀ·dy where dyᵀ·x belongs?)"


def transposed(error: BaseException) -> str:
    """'; the two shapes are each other's transpose ...' when ``error`` is numpy's "could not
    broadcast input array from shape (3,4) into shape (4,3)" (``p.grad[...] = x.T @ dy``), else ''."""
    m = _BROADCAST.search(str(error)) if isinstance(error, ValueError) else None
    if m is None or (m[1], m[2]) != (m[4], m[3]) or m[1] == m[2]:
        return ""
    return f"; the two shapes are each other's transpose: {TRANSPOSED}"


def transposed_shape(got, want) -> str:
    """' (transposed: ...)' when the 2-D shape ``got`` is ``want`` reversed (and not square), else ''."""
    got, want = tuple(got), tuple(want)
    return f" (transposed: {TRANSPOSED})" if len(got) == 2 and got == want[::-1] != want else ""


def mismatch(a, shape: tuple, dtypes, backend, model_dtype) -> str | None:
    """None when ``a`` is an array of ``shape`` with a dtype in ``dtypes`` (None: any) on the
    backend's device; else 'shape (..) dtype [on numpy]; expected shape (..) dtype on cpu'."""
    here = a is not None and hasattr(a, "shape") and array_module(a) is backend.xp
    if here and tuple(a.shape) == tuple(shape) and (dtypes is None or a.dtype in dtypes):
        return None
    got = "None" if a is None else f"shape {tuple(getattr(a, 'shape', ()))} {getattr(a, 'dtype', type(a).__name__)}"
    where = "" if a is None or here else f" on {array_module(a).__name__}"
    want = model_dtype if dtypes is None or model_dtype in dtypes else next(iter(dtypes))
    hint = transposed_shape(getattr(a, "shape", ()), shape) if a is not None else ""
    return f"{got}{where}; expected shape {tuple(shape)} {want} on {backend.name}{hint}"
