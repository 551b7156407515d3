"""Optimizers update trainable parameters in place from their gradients.

``setup(named_params)`` is called once with ``[(qualified_name, Parameter), ...]``; ``step()``
applies one update. State (momenta, moments, step count) is exposed by ``state_dict()`` as
flat name -> array entries so checkpoints can store it without pickling.
"""
from __future__ import annotations

from typing import Annotated

import numpy as np

from .backend import array_module
from .options import NonNegativeFloat, PositiveFloat, Range
from .registry import optimizers


class Optimizer:
    """Base class. Subclasses implement ``_update(state, param)``; ``learning_rate`` may be
    changed between steps (schedules).

    An optimizer whose update is purely elementwise sets ``elementwise = True``: ``step`` then
    applies ``_update`` to cache-sized blocks of large parameters (views of the parameter, its
    gradient and its state), so the update's several passes hit L2 cache instead of memory.
    """

    slots: tuple[str, ...] = ()
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

    def step(self) -> None:
        """Apply one update to every trainable parameter."""
        self.iterations += 1
        for name, p in self.params:
            if self.elementwise and p.data.size > self.block_size:
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

    def state_dict(self) -> dict[str, np.ndarray]:
        """Flat {"<param>/<slot>": array, "iterations": int array} for checkpoints."""
        out = {f"{n}/{s}": arr for n, slots in self.state.items() for s, arr in slots.items()}
        out["iterations"] = np.asarray(self.iterations, dtype=np.int64)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` produced (arrays are copied into the existing buffers)."""
        for n, slots in self.state.items():
            for s, buf in slots.items():
                buf[...] = state[f"{n}/{s}"]
        self.iterations = int(state["iterations"])

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None) or {}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in spec.items() if k != 'type')})"


optimizers.base = Optimizer


@optimizers.register()
class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay.

    g ← ∇w + weight_decay·w;  v ← momentum·v + g;  w ← w − lr·v
    (Nesterov: w ← w − lr·(g + momentum·v)). This is PyTorch's formulation; with momentum 0 it
    is plain w ← w − lr·g.

    Args:
        learning_rate: step size lr.
        momentum: momentum coefficient in [0, 1).
        nesterov: use Nesterov momentum (needs momentum > 0).
        weight_decay: L2 coefficient added to the gradient (coupled decay).
    """

    elementwise = True

    def __init__(self, learning_rate: PositiveFloat = 0.01,
                 momentum: Annotated[float, Range(0, 1, max_inclusive=False)] = 0.0,
                 nesterov: bool = False, weight_decay: NonNegativeFloat = 0.0):
        if nesterov and momentum == 0:
            raise ValueError("nesterov: true needs momentum > 0")
        super().__init__(learning_rate)
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.slots = ("velocity",) if momentum else ()

    def _update(self, state, p) -> None:
        g = p.grad
        if self.weight_decay:
            g += self.weight_decay * p.data  # grads are rewritten every backward: safe in place
        if not self.momentum:
            g *= self.learning_rate  # g is rewritten by every backward: it doubles as scratch
            p.data -= g
            return
        xp = array_module(g)
        v = state["velocity"]
        v *= self.momentum
        v += g
        if self.nesterov:  # w -= lr·(g + momentum·v), in two in-place steps through g
            g *= self.learning_rate
            p.data -= g
            xp.multiply(v, self.learning_rate * self.momentum, out=g)
        else:
            xp.multiply(v, self.learning_rate, out=g)
        p.data -= g


@optimizers.register()
class Adam(Optimizer):
    """Adam (Kingma & Ba 2015) with bias correction.

    m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
    w ← w − lr·m̂/(√v̂ + ε), with m̂ = m/(1−β1ᵗ), v̂ = v/(1−β2ᵗ).

    Args:
        learning_rate: step size lr.
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        epsilon: added to the denominator.
        weight_decay: L2 coefficient added to the gradient (coupled, as in torch.optim.Adam).
    """

    slots = ("m", "v")
    elementwise = True

    def __init__(self, learning_rate: PositiveFloat = 0.001,
                 beta1: Annotated[float, Range(0, 1, max_inclusive=False)] = 0.9,
                 beta2: Annotated[float, Range(0, 1, max_inclusive=False)] = 0.999,
                 epsilon: PositiveFloat = 1e-8, weight_decay: NonNegativeFloat = 0.0):
        super().__init__(learning_rate)
        self.beta1, self.beta2, self.epsilon, self.weight_decay = beta1, beta2, epsilon, weight_decay

    def step(self) -> None:
        t = self.iterations + 1
        # bias corrections folded into one Python-float step size and epsilon (no up-cast)
        self._lr_t = self.learning_rate * (1 - self.beta2 ** t) ** 0.5 / (1 - self.beta1 ** t)
        self._eps_t = self.epsilon * (1 - self.beta2 ** t) ** 0.5
        super().step()

    def _update(self, state, p) -> None:
        g = p.grad
        if self.weight_decay:
            g += self.weight_decay * p.data
        m, v = state["m"], state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        g *= g
        v += (1 - self.beta2) * g
        # g is free now (rewritten by the next backward): use it as the scratch buffer
        xp = array_module(v)
        xp.sqrt(v, out=g)
        g += self._eps_t
        xp.divide(m, g, out=g)
        g *= self._lr_t
        p.data -= g
