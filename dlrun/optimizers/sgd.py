"""SGD with optional (Nesterov) momentum."""
from __future__ import annotations

import numpy as np

from ..backend import Kernel, array_module
from ..registry.options import Fraction, NonNegativeFloat, PositiveFloat
from ..registry import optimizers
from .base import Optimizer

# GPU: the whole update in one launch
# (h: the per-step values on the device, Optimizer.per_step: h[0] the learning rate)
_PLAIN = Kernel("T g, raw T h, T wd", "T w", "T lr = h[0]; w -= lr * (g + wd * w);", "dlrun_sgd")
_MOMENTUM = Kernel("T g, raw T h, T wd, T mom, bool nesterov", "T w, T v",
                   "T lr = h[0]; T d = g + wd * w; v = mom * v + d; w -= lr * (nesterov ? d + mom * v : v);",
                   "dlrun_sgd_momentum")


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
    capturable = True
    _typed = None  # the hyperparameters as scalars of the tensors' type, and what they were made from

    def __init__(self, learning_rate: PositiveFloat = 0.01, momentum: Fraction = 0.0,
                 nesterov: bool = False, weight_decay: NonNegativeFloat = 0.0):
        if nesterov and momentum == 0:
            raise ValueError("nesterov: true needs momentum > 0")
        super().__init__(learning_rate)
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.slots = ("velocity",) if momentum else ()
        self.needs_work = weight_decay > 0 or nesterov

    def _update(self, state, p) -> None:
        g = p.grad  # rewritten by every backward, so it doubles as scratch here
        xp = array_module(g)
        if self.fuses(xp):  # GPU: the whole update in one fused kernel
            self._update_fused(xp, g, state, p)
            return
        # the CPU (numpy)
        w = p.data  # a local: `p.data -= g` would also call Parameter.__setattr__
        lr, mom, decay = self.typed(w.dtype.type)  # hyperparameters as the tensors' scalars (see Optimizer)
        if decay:
            self._add_decay(g, w, decay, state["_work"])
        # (numpy's ufuncs with their output given positionally: the same loops as g *= lr and
        # out=g, with less Python per call, which on a small network is much of the update)
        if not mom:
            np.multiply(g, lr, g)
            np.subtract(w, g, w)
            return
        v = state["velocity"]
        np.multiply(v, mom, v)
        np.add(v, g, v)
        if self.nesterov:  # step = g + momentum·v
            np.multiply(v, mom, state["_work"])
            np.add(g, state["_work"], g)
            np.multiply(g, lr, g)
        else:  # step = v; v is state, so scale it into g
            np.multiply(v, lr, g)
        np.subtract(w, g, w)

    def typed(self, f) -> tuple:
        """(learning rate, momentum, weight decay) as scalars of type ``f``, made again only when
        one of them is another object than last time (a schedule sets a new learning rate)."""
        c = self._typed
        lr, mom, decay = self.learning_rate, self.momentum, self.weight_decay
        if c is None or c[0] is not lr or c[1] is not mom or c[2] is not decay or c[3] is not f:
            c = self._typed = (lr, mom, decay, f, (f(lr), f(mom), f(decay)))
        return c[4]

    def fuses(self, xp) -> bool:
        return _PLAIN.on(xp) is not None

    def _update_fused(self, xp, g, state, p) -> None:
        if self.momentum:
            _MOMENTUM.on(xp)(g, self.hyper, self.weight_decay, self.momentum, self.nesterov, p.data,
                             state["velocity"])
        else:
            _PLAIN.on(xp)(g, self.hyper, self.weight_decay, p.data)
