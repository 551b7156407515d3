"""LSoftmax: the large-margin softmax head (Liu et al. 2016, arXiv 1612.02295)."""
from __future__ import annotations

from .initializers import Initializer
from ..registry.options import NonNegativeFloat, PositiveFloat, PositiveInt
from ..registry import layers
from .base import InputSpec, Layer
from .linear import _init


def chebyshev(c, m: int):
    """(T_m(c), U_{m−1}(c)): cos(mθ) for c = cos θ, and sin(mθ)/sin θ (so T_m′ = m·U_{m−1})."""
    t_prev, t = 1 + 0 * c, c  # T_0, T_1
    u_prev, u = 0 * c, 1 + 0 * c  # U_{-1}, U_0
    for _ in range(m - 1):
        t_prev, t = t, 2 * c * t - t_prev
        u_prev, u = u, 2 * c * u - u_prev
    return t, u


@layers.register()
class LSoftmax(Layer):
    """f = x Wᵀ; in training out[i, y_i] = (‖x_i‖‖w_{y_i}‖ψ(θ_i) + β f[i, y_i]) / (1 + β).

    θ_i is the angle between x_i and w_{y_i}, ψ(θ) = (−1)^k cos(mθ) − 2k for θ ∈ [kπ/m,
    (k+1)π/m], with cos(mθ) from the Chebyshev polynomial T_m(cos θ). ψ is continuous and C¹,
    so the layer has no kink (except at x_i = 0 or w = 0). Every other logit, and every logit
    in evaluation, is f. m = 1 gives ψ = cos θ, a plain bias-free fully connected layer.

    β blends the margin logit with the plain one (large β: nearly plain; β = 0: full margin).
    After each training backward it anneals: β ← max(beta_min, β·scale) (mx-lsoftmax). β is
    declared ``state``: checkpoints save it, and gradcheck freezes it.

    Backward, with a = ‖x_i‖, b = ‖w_{y_i}‖, c = cos θ, T′ = m·U_{m−1}(c), s = (−1)^k and
    g_i = G[i, y_i]/(1+β): ∂φ/∂x_i = (b/a)ψ x_i + s T′ (w − (bc/a) x_i),
    ∂φ/∂w = (a/b)ψ w + s T′ (x_i − (ac/b) w); ∂L/∂x_i += g_i(∂φ/∂x_i − w) and
    ∂L/∂w_{y_i} += g_i(∂φ/∂w − x_i), scatter-added over repeated labels, on top of the plain
    fully connected gradients G W and Gᵀ x.

    Args:
        units: number of classes C (rows of W).
        margin: the integer margin m >= 1.
        beta: initial blending weight β >= 0.
        beta_min: the floor of the annealed β.
        scale: annealing factor per training step (1 keeps β fixed).
        weight_initializer: initializer for W.

    Shape:
        input (N, D) and integer labels (N,) -> output (N, units).
    """

    needs_labels = True
    has_phase = True
    state = ("beta",)
    input_spec = InputSpec(shape=("D",), options={"units": "C", "margin": 3, "beta": 0.5})

    def __init__(self, units: PositiveInt, margin: PositiveInt = 2, beta: NonNegativeFloat = 100.0,
                 beta_min: NonNegativeFloat = 0.0, scale: PositiveFloat = 0.99,
                 weight_initializer: Initializer = "xavier_uniform"):
        self.units, self.margin = units, margin
        self.beta, self.beta_min, self.scale = float(beta), float(beta_min), float(scale)
        self.weight_initializer = _init(weight_initializer)

    def build(self, input_shape):
        self.expect_rank(input_shape, 1, "(N, features) input; add a Flatten before it")
        d = input_shape[0]
        self.weight = self.add_param("weight", (self.units, d), self.weight_initializer, fan_in=d, fan_out=self.units)
        return (self.units,)

    def forward(self, x, y=None):
        xp, m = self.xp, self.margin
        w = self.weight.data
        f = self.backend.matmul(x, w.T)
        self._x, self._margin = x, None
        if not self.training or y is None:
            return f
        rows = xp.arange(x.shape[0])
        wy = w[y]
        a = xp.sqrt((x * x).sum(axis=1))
        b = xp.sqrt((wy * wy).sum(axis=1))
        t = f[rows, y]
        # a zero x_i (common after a ReLU) or w_y has no angle: its target logit stays the plain
        # f = 0 and its gradients the plain ones (as for margin 1); a, b = 1 there keep 0/0 out
        ok = xp.greater(a, 0) & xp.greater(b, 0)
        a, b = xp.where(ok, a, 1), xp.where(ok, b, 1)
        c = xp.clip(t / (a * b), -1, 1)
        k = xp.minimum(xp.floor(xp.true_divide(m * xp.arccos(c), xp.pi)), m - 1)
        sign = 1 - 2 * xp.remainder(k, 2)
        tm, um = chebyshev(c, m)
        psi = sign * tm - 2 * k
        beta = x.dtype.type(self.beta)
        f[rows, y] = xp.where(ok, xp.true_divide(a * b * psi + xp.multiply(t, beta), 1 + beta), t)
        self._margin = (rows, y, wy, a, b, c, m * sign * um, psi, beta, ok)
        return f

    def backward(self, dy):
        w, x = self.weight.data, self._x
        self.backend.matmul(dy.T, x, out=self.weight.grad)
        dx = self.backend.matmul(dy, w)
        if self._margin is None:
            return dx
        rows, y, wy, a, b, c, dpsi, psi, beta, ok = self._margin
        g = (self.xp.true_divide(dy[rows, y], 1 + beta) * ok)[:, None]
        a_, b_, c_, psi_, dpsi_ = a[:, None], b[:, None], c[:, None], psi[:, None], dpsi[:, None]
        dphi_dx = (b_ / a_) * psi_ * x + dpsi_ * (wy - (b_ * c_ / a_) * x)
        dphi_dw = (a_ / b_) * psi_ * wy + dpsi_ * (x - (a_ * c_ / b_) * wy)
        dx += g * (dphi_dx - wy)
        self.backend.scatter_add(self.weight.grad, y, g * (dphi_dw - x))
        self.beta = max(self.beta_min, self.beta * self.scale)  # anneal once per training step
        return dx
