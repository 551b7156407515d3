"""The optimizer base class: parameters, per-parameter state buffers, checkpointable state.

``setup(named_params)`` is called once with ``[(qualified_name, Parameter), ...]``; ``step()``
applies one update. State (momenta, moments, step count) is exposed by ``state_dict()`` as
flat name -> array entries so checkpoints can store it without pickling.
"""
from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..registry import optimizers


class Optimizer:
    """Base class. Subclasses implement ``_update(state, param)``; ``learning_rate`` may be
    changed between steps (schedules).

    ``slots`` name the per-parameter state buffers (saved in checkpoints). A subclass that needs
    a temporary array sets ``needs_work = True`` and gets ``state["_work"]``, a scratch buffer
    shaped like the parameter that is allocated once and never saved.

    An optimizer whose update is purely elementwise sets ``elementwise = True``: on the CPU
    ``step`` then applies ``_update`` to cache-sized blocks of large parameters (views of the
    parameter, its gradient and its state), so the update's several passes hit L2 cache instead
    of memory. On GPU the built-in optimizers instead run their whole update as one fused
    kernel per parameter (``backend.fused_elementwise``), and blocks would only multiply launches.
    """

    slots: tuple[str, ...] = ()
    needs_work: bool = False
    elementwise: bool = False
    block_size: int = 1 << 17  # elements per block (0.5 MiB per float32 array)

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate
        self.params: list = []
        self.state: dict[str, dict] = {}
        self.iterations = 0

    def setup(self, named_params) -> None:
        """Take the parameters to update; allocate per-parameter state buffers once."""
        self.params = [(n, p) for n, p in named_params if p.trainable]
        self.state = {n: {s: array_module(p.data).zeros_like(p.data) for s in self.slots} for n, p in self.params}
        if self.needs_work:
            for n, p in self.params:
                self.state[n]["_work"] = array_module(p.data).empty_like(p.data)

    def step(self) -> None:
        """Apply one update to every trainable parameter."""
        self.iterations += 1
        for name, p in self.params:
            if self.elementwise and p.data.size > self.block_size and isinstance(p.data, np.ndarray):
                for state, part in self._blocks(name, p):
                    self._update(state, part)
            else:
                self._update(self.state[name], p)

    def _blocks(self, name: str, p) -> list:
        """(state views, Parameter of views) per block of ``p``; rebuilt if a layer replaced an array."""
        cache = self.__dict__.setdefault("_block_cache", {})
        hit = cache.get(name)
        if hit is not None and hit[0] is p.data and hit[1] is p.grad:
            return hit[2]
        arrays = [p.data, p.grad, *self.state[name].values()]
        if not all(a.flags.c_contiguous for a in arrays):
            blocks = [(self.state[name], p)]
        else:
            flat = [a.reshape(-1) for a in arrays]
            keys = list(self.state[name])
            blocks = [({k: f[s:s + self.block_size] for k, f in zip(keys, flat[2:])},
                       type(p)(flat[0][s:s + self.block_size], flat[1][s:s + self.block_size]))
                      for s in range(0, p.data.size, self.block_size)]
        cache[name] = (p.data, p.grad, blocks)
        return blocks

    def _update(self, state: dict, p) -> None:
        raise NotImplementedError

    @staticmethod
    def _add_decay(g, w, weight_decay: float, work) -> None:
        """g ← g + weight_decay·w (coupled L2 decay) through the scratch buffer, no temporary."""
        array_module(w).multiply(w, weight_decay, out=work)
        g += work

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat {"<param>/<slot>": array, "iterations": int array} for checkpoints."""
        out = {f"{n}/{s}": slots[s] for n, slots in self.state.items() for s in self.slots}
        out["iterations"] = np.asarray(self.iterations, dtype=np.int64)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` produced (arrays are copied into the existing buffers)."""
        for n, slots in self.state.items():
            for s in self.slots:
                slots[s][...] = state[f"{n}/{s}"]
        self.iterations = int(state["iterations"])

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None) or {}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in spec.items() if k != 'type')})"


optimizers.base = Optimizer
