"""Per-shape scratch arrays that layers and losses reuse between batches.

In the training loop every batch has the same shape (except the last, partial one), so a
layer's outputs and gradients can be written into arrays allocated once per shape instead of
fresh multi-MB temporaries each step. The pool is *disabled* by default: ``get`` then returns
None, which numpy/cupy functions read as "allocate" (``xp.matmul(a, b, out=None)``), so the same
layer code works for direct calls, gradcheck and prediction, where callers may keep outputs.
The trainer enables it while it owns the outputs (see :meth:`dlrun.model.Sequential.train`).

A smaller array of a name (an epoch's last, partial batch; a shorter validation batch) is the
first rows of the largest one of that name, dtype and trailing shape, not memory of its own: a
C-ordered array's leading rows are contiguous, so the view is as good an ``out=`` as a new array,
and an epoch whose last batch is short holds no second set of scratch arrays. A larger request
made after smaller ones becomes the new largest, and the smaller ones become its views.
"""
from __future__ import annotations


class BufferPool:
    """Scratch arrays keyed by (name, shape, dtype), handed out while ``enabled``."""

    __slots__ = ("enabled", "_arrays", "_largest")  # scratch arrays and cached constants

    def __init__(self) -> None:
        self.enabled = False
        self._arrays: dict = {}
        self._largest: dict = {}  # (name, trailing shape, dtype) -> the array the smaller ones view

    def get(self, xp, name: str, shape: tuple, dtype):
        """The array for this key (allocated on first use, or a view of the leading rows of a
        larger one of the same name), or None when the pool is disabled."""
        if not self.enabled:
            return None
        key = (name, shape, dtype)
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = self._make(xp, name, shape, dtype)
        return a

    def _make(self, xp, name: str, shape: tuple, dtype):
        if not shape:
            return xp.empty(shape, dtype)
        family = (name, shape[1:], dtype)
        root = self._largest.get(family)
        if root is not None and root.shape[0] >= shape[0]:
            return root[:shape[0]]
        root = self._largest[family] = xp.empty(shape, dtype)
        # the smaller ones made so far are looked up again, and made as views of this one
        for k in [k for k in self._arrays if len(k) == 3 and k[0] == name and type(k[1]) is tuple
                  and k[2] == dtype and len(k[1]) == len(shape) and k[1][1:] == shape[1:]]:
            del self._arrays[k]
        return root

    def group(self, key, make):
        """Several scratch arrays made together by ``make()`` (an object holding them), so a
        layer or loss pays one lookup per call instead of one per array. ``key`` must name
        everything they depend on (shapes, dtypes). Cached while enabled; made fresh while
        disabled, since callers may then keep what was written into them."""
        if not self.enabled:
            return make()
        g = self._arrays.get(key)
        if g is None:
            g = self._arrays[key] = make()
        return g

    def ones(self, xp, n: int, dtype):
        """A cached vector of n ones (a constant: safe to share whether or not the pool is enabled)."""
        key = ("ones", n, dtype, xp)  # looked up here, not through constant(): this is per batch
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = xp.ones(n, dtype)
        return a

    def constant(self, xp, key, make):
        """``make()``, called once per (key, array module) and cached: for arrays nobody writes to
        (ones, index ranges), so they are shared whether or not the pool is enabled. ``key`` must
        name everything the array depends on (shapes, dtype)."""
        key = ("constant", key, xp)
        a = self._arrays.get(key)
        if a is None:
            a = self._arrays[key] = make()
        return a

    def clear(self) -> None:
        self._arrays.clear()

    def __len__(self) -> int:
        return len(self._arrays)
