"""Adam and AdamW (decoupled weight decay)."""
from __future__ import annotations

from ..backend import Kernel, array_module
from ..registry.options import Fraction, NonNegativeFloat, PositiveFloat
from ..registry import optimizers
from .base import Optimizer

# GPU: the whole update in one launch (wd: coupled decay; keep: AdamW's decoupled shrink)
# (h: the per-step values on the device, Adam.per_step: the step size and epsilon with the bias
# corrections folded in, and AdamW's shrink, which follows the scheduled learning rate)
_ADAM = Kernel("T g, raw T h, T b1, T b2, T wd", "T w, T m, T v",
               "T lr_t = h[0]; T eps_t = h[1]; T keep = h[2]; T d = g + wd * w; w *= keep; m = b1 * m + (1 - b1) * d; "
               "v = b2 * v + (1 - b2) * d * d; w -= lr_t * m / (sqrt(v) + eps_t);", "dlrun_adam")


@optimizers.register()
class Adam(Optimizer):
    """Adam (Kingma & Ba 2015): w ← w − lr·m̂/(√v̂ + ε), with bias-corrected moments.

    g ← ∇w + weight_decay·w;  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
    m̂ = m/(1−β1ᵗ),  v̂ = v/(1−β2ᵗ), t the step count (from 1). As torch.optim.Adam.

    Args:
        learning_rate: step size lr.
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        epsilon: added to the denominator.
        weight_decay: L2 coefficient added to the gradient (coupled, as in torch.optim.Adam;
            AdamW decouples it).
    """

    elementwise = True
    capturable = True

    slots = ("m", "v")
    decoupled = False

    def __init__(self, learning_rate: PositiveFloat = 0.001, beta1: Fraction = 0.9, beta2: Fraction = 0.999,
                 epsilon: PositiveFloat = 1e-8, weight_decay: NonNegativeFloat = 0.0):
        super().__init__(learning_rate)
        self.beta1, self.beta2, self.epsilon, self.weight_decay = beta1, beta2, epsilon, weight_decay
        self.needs_work = weight_decay > 0 and not self.decoupled
        self._lr_t = self._eps_t = 0.0  # this step's, set by begin_step

    def begin_step(self) -> None:
        t = self.iterations + 1
        # m̂/(√v̂+ε) = m·√(1−β2ᵗ)/(1−β1ᵗ) / (√v + ε√(1−β2ᵗ)): the bias corrections fold into a
        # Python-float step size and epsilon, so no array is rescaled and nothing up-casts
        c2 = (1.0 - self.beta2 ** t) ** 0.5
        self._lr_t = self.learning_rate * c2 / (1.0 - self.beta1 ** t)
        self._eps_t = self.epsilon * c2
        super().begin_step()

    def per_step(self) -> tuple:
        keep = 1.0 - self.learning_rate * self.weight_decay if self.decoupled else 1.0
        return (self._lr_t, self._eps_t, keep)

    def fuses(self, xp) -> bool:
        return _ADAM.on(xp) is not None

    def _update(self, state, p) -> None:
        g = p.grad
        xp = array_module(g)
        if self.fuses(xp):
            coupled = 0.0 if self.decoupled else self.weight_decay
            _ADAM.on(xp)(g, self.hyper, self.beta1, self.beta2, coupled, p.data, state["m"], state["v"])
            return
        w = p.data  # a local: `p.data -= g` would also call Parameter.__setattr__
        f = w.dtype.type  # hyperparameters as the tensors' scalars (see Optimizer)
        if self.weight_decay:
            if self.decoupled:
                w *= f(1.0 - self.learning_rate * self.weight_decay)
            else:
                self._add_decay(g, w, f(self.weight_decay), state["_work"])
        m, v = state["m"], state["v"]
        # m ← β1·m + (1−β1)·g written as β1·(m − g) + g: in place, no temporary array
        m -= g
        m *= f(self.beta1)
        m += g
        g *= g  # g is free from here on (the next backward rewrites it): reuse it as scratch
        v -= g
        v *= f(self.beta2)
        v += g
        xp.sqrt(v, out=g)
        g += f(self._eps_t)
        xp.divide(m, g, out=g)
        g *= f(self._lr_t)
        w -= g


@optimizers.register()
class AdamW(Adam):
    """AdamW (Loshchilov & Hutter 2019): w ← w·(1 − lr·λ) − lr·m̂/(√v̂ + ε), decoupled decay.

    The weight decay λ shrinks the weights directly instead of entering the gradient, so it is
    not rescaled by the adaptive denominator; moments as in Adam. As torch.optim.AdamW (the decay
    is multiplied by the current learning rate, so schedules scale it too).

    Args:
        learning_rate: step size lr.
        beta1: decay of the first moment, in [0, 1).
        beta2: decay of the second moment, in [0, 1).
        epsilon: added to the denominator.
        weight_decay: decoupled decay coefficient λ (torch's default 0.01).
    """

    decoupled = True
    capturable = True

    def __init__(self, learning_rate: PositiveFloat = 0.001, beta1: Fraction = 0.9, beta2: Fraction = 0.999,
                 epsilon: PositiveFloat = 1e-8, weight_decay: NonNegativeFloat = 0.01):
        super().__init__(learning_rate, beta1, beta2, epsilon, weight_decay)
