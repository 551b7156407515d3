"""The optimizer base class: parameters, per-parameter state buffers, checkpointable state.

``setup(named_params)`` is called once with ``[(qualified_name, Parameter), ...]``; ``step()``
applies one update. State (momenta, moments, step count) is exposed by ``state_dict()`` as
flat name -> array entries so checkpoints can store it without pickling.
"""
from __future__ import annotations

import numpy as np

from ..backend import array_module, upload
from ..layers.base import Parameter
from ..registry import optimizers


class Optimizer:
    """Base class. Subclasses implement ``_update(state, param)``; ``learning_rate`` may be
    changed between steps (schedules).

    ``slots`` name the per-parameter state buffers (saved in checkpoints). A subclass that needs
    a temporary array sets ``needs_work = True`` and gets ``state["_work"]``, a scratch buffer
    shaped like the parameter that is allocated once and never saved. One whose update runs as
    a single fused kernel on a device says so with :meth:`fuses` and gets no scratch there.

    An optimizer whose update is purely elementwise (same hyperparameters for every entry of
    every parameter) sets ``elementwise = True``. ``step`` then runs ``_update`` once over the
    model's flat parameter buffer (see :mod:`dlrun.backend.arena`) instead of once per parameter, and
    on the CPU splits a large buffer into cache-sized blocks (views of the parameters, their
    gradient and their state), so the update's several passes hit L2 cache instead of memory.
    On GPU the built-in optimizers run their whole update as one fused kernel
    (a ``backend.Kernel``), and blocks would only multiply launches. That kernel reads the values
    that change between steps (:meth:`per_step`) from a small device array, ``self.hyper``,
    which :meth:`begin_step` fills; ``capturable = True`` says so.

    On the CPU the built-ins pass their hyperparameters to numpy as scalars of the tensors' dtype
    (``w.dtype.type(self.momentum)``): a Python float meets a float32 array as a float32 anyway
    (numpy's promotion rules), so the result is the same, but numpy takes a slower path for it,
    about half a microsecond more per call, which on a small network is most of the update.
    """

    slots: tuple[str, ...] = ()
    needs_work: bool = False
    elementwise: bool = False
    block_size: int = 1 << 17  # elements per block (0.5 MiB per float32 array)
    _flat = None  # (arena, flat state, whole-model Parameter, flat slot arrays) when setup packed the update
    _flat_parts: list = []  # what update runs on then: [(state, Parameter)], the flat arrays or their blocks
    _hyper = None  # (host values, device array) of per_step(), when the update runs as a fused kernel
    # True: the fused kernel reads every value that changes between steps from ``hyper`` (set by
    # begin_step), so a CUDA graph may capture ``update``. Declared by each class itself: a
    # subclass that changes the update is not capturable until it says so.
    capturable = False

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate
        self.params: list = []
        self.state: dict[str, dict] = {}
        self.iterations = 0

    def setup(self, named_params, arena=None) -> None:
        """Take the parameters to update; allocate per-parameter state buffers once.

        ``arena`` is the model's :class:`~dlrun.backend.arena.ParamArena`. When it holds exactly these
        parameters and the update is ``elementwise``, state is allocated flat in the same
        layout (``self.state`` keeps per-parameter views of it) and ``step`` updates every
        parameter in one pass over the flat arrays.
        """
        self.params = [(n, p) for n, p in named_params if p.trainable]
        self._flat = None
        first = self.params[0][1].data if self.params else None
        fused = first is not None and self.fuses(array_module(first))
        if fused:  # the per-step values the kernel reads, on the host and on the device
            host = np.zeros(len(self.per_step()), first.dtype)
            self._hyper = (host, array_module(first).asarray(host))
        work = self.needs_work and not fused
        if self.elementwise and arena is not None and arena.holds([p for _, p in self.params]):
            keys = self.slots + (("_work",) if work else ())
            flat = {k: arena.zeros_like() for k in keys}
            whole = Parameter(arena.data, arena.grad)
            self._flat = (arena, flat, whole, [flat[s] for s in self.slots])
            self._flat_parts = self._parts("*", flat, whole)  # the flat arrays are never replaced
            self.state = {n: {k: arena.view(f, p) for k, f in flat.items()} for n, p in self.params}
            return
        self.state = {n: {s: array_module(p.data).zeros_like(p.data) for s in self.slots} for n, p in self.params}
        if work:
            for n, p in self.params:
                self.state[n]["_work"] = array_module(p.data).empty_like(p.data)

    def fuses(self, xp) -> bool:
        """True when ``_update`` runs as one fused kernel on array module ``xp`` and so needs no
        ``_work`` there (the built-ins on CuPy). Plugins keep this default."""
        return False

    def step(self) -> None:
        """Apply one update to every trainable parameter: :meth:`begin_step` on the host, then
        :meth:`update` on the device."""
        self.begin_step()
        self.update()

    def begin_step(self) -> None:
        """The host's part of a step: count it, and where the update runs as a fused kernel,
        copy the values that change from step to step (:meth:`per_step`: the learning rate a
        schedule sets, Adam's bias corrections) into a small device array the kernel reads, so
        that the device's part reads nothing from Python and can be captured in a CUDA graph
        (see :mod:`dlrun.training.capture`)."""
        self.iterations += 1
        if self._hyper is not None:
            host, device = self._hyper
            host[:] = self.per_step()
            upload(device, host)

    def per_step(self) -> tuple:
        """The values of this step that the fused kernel reads from the device array ``hyper``
        (the built-ins: the learning rate first)."""
        return (self.learning_rate,)

    @property
    def hyper(self):
        """The device array of :meth:`per_step`'s values (None unless the update is fused)."""
        return None if self._hyper is None else self._hyper[1]

    def update(self) -> None:
        """The device's part of a step (after :meth:`begin_step`): every parameter updated."""
        if self._flat is not None:
            if self._flat[0].dirty:
                self._flat[0].adopt()
            for state, p in self._flat_parts:
                self._update(state, p)
            return
        for name, p in self.params:
            for state, part in self._parts(name, self.state[name], p):
                self._update(state, part)

    def buffers(self) -> list:
        """The distinct arrays holding this optimizer's state (the flat ones when flat)."""
        if self._flat is not None:
            return self._flat[3]
        return [slots[s] for slots in self.state.values() for s in self.slots]

    def _parts(self, key: str, state: dict, p) -> list:
        """``[(state, Parameter)]`` that ``_update`` runs on for parameter ``p``: ``p`` itself, or
        cache-sized blocks of it (an elementwise update of a large host array)."""
        if self.elementwise and p.data.size > self.block_size and isinstance(p.data, np.ndarray):
            return self._blocks(key, state, p)
        return [(state, p)]

    def _blocks(self, key: str, state: dict, p) -> list:
        """(state views, Parameter of views) per block of ``p``; rebuilt if a layer replaced an array."""
        cache = self.__dict__.setdefault("_block_cache", {})
        hit = cache.get(key)
        if hit is not None and hit[0] is p.data and hit[1] is p.grad:
            return hit[2]
        arrays = [p.data, p.grad, *state.values()]
        if not all(a.flags.c_contiguous for a in arrays):
            blocks = [(state, p)]
        else:
            flat = [a.reshape(-1) for a in arrays]
            keys = list(state)
            blocks = [({k: f[s:s + self.block_size] for k, f in zip(keys, flat[2:])},
                       type(p)(flat[0][s:s + self.block_size], flat[1][s:s + self.block_size]))
                      for s in range(0, p.data.size, self.block_size)]
        cache[key] = (p.data, p.grad, blocks)
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
