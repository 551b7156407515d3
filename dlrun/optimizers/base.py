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
    """

    slots: tuple[str, ...] = ()
    needs_work: bool = False

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
            self._update(self.state[name], p)

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
