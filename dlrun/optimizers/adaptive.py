"""RMSProp and AdaGrad: per-coordinate step sizes from accumulated squared gradients."""
from __future__ import annotations

from ..backend import Kernel, array_module
from ..registry.options import Fraction, NonNegativeFloat, PositiveFloat
from ..registry import optimizers
from .base import Optimizer

# GPU: each update in one launch
# (h: the per-step values on the device, Optimizer.per_step: h[0] the learning rate)
_RMSPROP = Kernel("T g, raw T h, T rho, T eps, T wd", "T w, T v",
                  "T lr = h[0]; T d = g + wd * w; v = rho * v + (1 - rho) * d * d; w -= lr * d / (sqrt(v) + eps);",
                  "dlrun_rmsprop")
_RMSPROP_MOMENTUM = Kernel("T g, raw T h, T rho, T eps, T wd, T mom", "T w, T v, T b",
                           "T lr = h[0]; T d = g + wd * w; v = rho * v + (1 - rho) * d * d; b = mom * b + d / (sqrt(v) + eps); "
                           "w -= lr * b;", "dlrun_rmsprop_momentum")
_ADAGRAD = Kernel("T g, raw T h, T eps, T wd", "T w, T s",
                  "T lr = h[0]; T d = g + wd * w; s += d * d; w -= lr * d / (sqrt(s) + eps);", "dlrun_adagrad")


@optimizers.register()
class RMSProp(Optimizer):
    """RMSProp (Hinton 2012): v ← ρ·v + (1−ρ)·g²;  w ← w − lr·g/(√v + ε).

    g ← ∇w + weight_decay·w first. With momentum μ > 0 the step is buffered:
    b ← μ·b + g/(√v + ε);  w ← w − lr·b. As torch.optim.RMSprop (not centered; ε outside the
    square root).

    Args:
        learning_rate: step size lr.
        rho: decay ρ of the running mean of g², in [0, 1) (torch calls it alpha).
        epsilon: added to the denominator.
        momentum: momentum coefficient μ in [0, 1); 0 turns the buffer off.
        weight_decay: L2 coefficient added to the gradient (coupled decay).
    """

    elementwise = True
    capturable = True

    needs_work = True

    def __init__(self, learning_rate: PositiveFloat = 0.001, rho: Fraction = 0.9, epsilon: PositiveFloat = 1e-8,
                 momentum: Fraction = 0.0, weight_decay: NonNegativeFloat = 0.0):
        super().__init__(learning_rate)
        self.rho, self.epsilon, self.momentum, self.weight_decay = rho, epsilon, momentum, weight_decay
        self.slots = ("square_avg", "momentum_buffer") if momentum else ("square_avg",)

    def fuses(self, xp) -> bool:
        return _RMSPROP.on(xp) is not None

    def _update(self, state, p) -> None:
        g = p.grad
        xp = array_module(g)
        if self.fuses(xp):
            args = (g, self.hyper, self.rho, self.epsilon, self.weight_decay)
            if self.momentum:
                _RMSPROP_MOMENTUM.on(xp)(*args, self.momentum, p.data, state["square_avg"], state["momentum_buffer"])
            else:
                _RMSPROP.on(xp)(*args, p.data, state["square_avg"])
            return
        work = state["_work"]
        w = p.data  # a local: `p.data -= g` would also call Parameter.__setattr__
        f = w.dtype.type  # hyperparameters as the tensors' scalars (see Optimizer)
        if self.weight_decay:
            self._add_decay(g, w, f(self.weight_decay), work)
        v = state["square_avg"]
        xp.multiply(g, g, out=work)
        # v ← ρ·v + (1−ρ)·g² as ρ·(v − g²) + g²: in place
        v -= work
        v *= f(self.rho)
        v += work
        xp.sqrt(v, out=work)
        work += f(self.epsilon)
        g /= work
        if self.momentum:
            b = state["momentum_buffer"]
            b *= f(self.momentum)
            b += g
            xp.multiply(b, f(self.learning_rate), out=g)
        else:
            g *= f(self.learning_rate)
        w -= g


@optimizers.register()
class AdaGrad(Optimizer):
    """AdaGrad (Duchi et al. 2011): s ← s + g²;  w ← w − lr·g/(√s + ε).

    g ← ∇w + weight_decay·w first; s starts at ``initial_accumulator_value``. As
    torch.optim.Adagrad without learning-rate decay.

    Args:
        learning_rate: step size lr.
        initial_accumulator_value: starting value of every entry of s (Keras uses 0.1).
        epsilon: added to the denominator.
        weight_decay: L2 coefficient added to the gradient (coupled decay).
    """

    elementwise = True
    capturable = True

    slots = ("sum",)
    needs_work = True

    def __init__(self, learning_rate: PositiveFloat = 0.01, initial_accumulator_value: NonNegativeFloat = 0.0,
                 epsilon: PositiveFloat = 1e-10, weight_decay: NonNegativeFloat = 0.0):
        super().__init__(learning_rate)
        self.initial_accumulator_value, self.epsilon, self.weight_decay = initial_accumulator_value, epsilon, weight_decay

    def setup(self, named_params, arena=None) -> None:
        super().setup(named_params, arena)
        for slots in self.state.values():
            slots["sum"][...] = self.initial_accumulator_value

    def fuses(self, xp) -> bool:
        return _ADAGRAD.on(xp) is not None

    def _update(self, state, p) -> None:
        g = p.grad
        xp = array_module(g)
        if self.fuses(xp):
            _ADAGRAD.on(xp)(g, self.hyper, self.epsilon, self.weight_decay, p.data, state["sum"])
            return
        work = state["_work"]
        w = p.data  # a local: `p.data -= g` would also call Parameter.__setattr__
        f = w.dtype.type  # hyperparameters as the tensors' scalars (see Optimizer)
        if self.weight_decay:
            self._add_decay(g, w, f(self.weight_decay), work)
        s = state["sum"]
        xp.multiply(g, g, out=work)
        s += work
        xp.sqrt(s, out=work)
        work += f(self.epsilon)
        g /= work
        g *= f(self.learning_rate)
        w -= g
