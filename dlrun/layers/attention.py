"""MultiHeadAttention: scaled dot-product self-attention over a sequence, all heads at once."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ShapeError
from .initializers import Initializer
from ..registry.options import Fraction, PositiveInt
from ..losses.regularizers import Regularizer
from ..registry import layers
from .base import InputSpec, Layer
from .dropout import drop
from .linear import _init


@layers.register()
class MultiHeadAttention(Layer):
    """y = [A_1 v_1, …, A_h v_h] W_oᵀ + b_o, A_i = softmax(q_i k_iᵀ/√d + M), [q k v] = x W_inᵀ + b_in.

    Self-attention (Vaswani et al. 2017) over a batch of sequences, batch first: input
    (N, T, E) -> output (N, T, E), E inferred when the model is built. Every position is a
    query, a key and a value at once: x (T × E) is projected to queries, keys and values of
    h heads of size d; head i's weights A_i (T × T, rows summing to 1) mix its values v_i; the
    h results are concatenated (T × h·d) and projected back to E. The softmax subtracts each
    row's maximum, so large scores neither overflow nor give NaN.

    The mask M: with ``causal``, M_ts = −inf for s > t, so position t attends to positions
    0…t only (a decoder's mask); otherwise M = 0 and every position sees every other. (PyTorch
    takes a mask tensor instead, ``attn_mask``, whose True entries are the forbidden ones.)

    Parameters, packed as PyTorch packs them: ``in_weight`` (3·h·d, E) holds the query, key
    and value projections stacked in that order (PyTorch's ``in_proj_weight``; head i uses
    rows i·d … (i+1)·d − 1 of each third), ``in_bias`` (3·h·d,), ``out_weight`` (E, h·d) and
    ``out_bias`` (E,) (``out_proj.weight`` and ``.bias``): weights copy across unchanged.

    Backward, per head, with dO the gradient of A' v (A' the weights after dropout, mask its
    multiplier): dv = A'ᵀ dO; dA = (dO vᵀ) ⊙ mask; dS = A ⊙ (dA − rowsum(dA ⊙ A));
    dq = dS k/√d; dk = dSᵀ q/√d; then the projections' gradients as for Linear. All heads and
    samples are batched matrix products over (N, h). The key bias gets gradient 0: it adds the
    same q·b_k to every score of a row, which the softmax ignores.

    Args:
        heads: number of heads h.
        key_dim: size d of each head's queries, keys and values. Default E / heads (E must then
            be a multiple of heads, as in PyTorch); given, h·d may differ from E (as Keras'
            ``key_dim``): the output projection maps h·d back to E.
        causal: position t attends only to positions s ≤ t (a decoder's mask).
        dropout: probability of dropping each attention weight while training (inverted: the
            kept weights are scaled by 1/(1 − dropout)); evaluation uses every weight.
        use_bias: add the biases b_in and b_o.
        weight_initializer: initializer of W_in and W_o. Each of the query, key and value
            projections gets its own fans (E in, h·d out), as three Linear layers would.
        bias_initializer: initializer of b_in and b_o.
        weight_regularizer: penalty on W_in and W_o (overrides the run-wide regularizer).
        bias_regularizer: penalty on b_in and b_o (biases are otherwise not regularized).

    Shape:
        input (N, T, E) -> output (N, T, E).

    Example:
        ``- {type: MultiHeadAttention, heads: 4, causal: true, dropout: 0.1}``
    """

    has_phase = True
    stochastic = True
    input_spec = InputSpec(shape=("T", "D"), options={"heads": 2, "key_dim": "C"})

    def __init__(self, heads: PositiveInt = 1, key_dim: PositiveInt | None = None, causal: bool = False,
                 dropout: Fraction = 0.0, use_bias: bool = True,
                 weight_initializer: Initializer = "xavier_uniform",
                 bias_initializer: Initializer = "zeros",
                 weight_regularizer: Regularizer | None = None,
                 bias_regularizer: Regularizer | None = None):
        self.heads = heads
        self.key_dim = key_dim
        self.causal = causal
        self.dropout = dropout
        self.use_bias = use_bias
        self.weight_initializer = _init(weight_initializer)
        self.bias_initializer = _init(bias_initializer)
        self.weight_regularizer = weight_regularizer
        self.bias_regularizer = bias_regularizer

    def build(self, input_shape):
        self.expect_rank(input_shape, 2, "(N, T, E) input, a sequence of T vectors of size E (an Embedding's output)")
        t, e = (int(s) for s in input_shape)
        h = self.heads
        if self.key_dim is None and e % h:
            raise ShapeError(f"MultiHeadAttention(heads={h}) splits the embedding size E={e} among its heads, but "
                             f"{e} is not a multiple of {h}; change heads or give key_dim (each head's size)")
        d = self.key_dim if self.key_dim is not None else e // h
        inner = h * d
        self._d, self._scale = d, 1.0 / math.sqrt(d)
        self.in_weight = self.add_param("in_weight", (3 * inner, e), self.weight_initializer, fan_in=e,
                                        fan_out=inner, regularizer=self.weight_regularizer)
        self.out_weight = self.add_param("out_weight", (e, inner), self.weight_initializer, fan_in=inner,
                                         fan_out=e, regularizer=self.weight_regularizer)
        self.in_bias = self.out_bias = None
        if self.use_bias:
            self.in_bias = self.add_param("in_bias", (3 * inner,), self.bias_initializer, fan_in=e, fan_out=inner,
                                          regularizer=self.bias_regularizer, regularize=False)
            self.out_bias = self.add_param("out_bias", (e,), self.bias_initializer, fan_in=inner, fan_out=e,
                                           regularizer=self.bias_regularizer, regularize=False)
        return (t, e)

    def forward(self, x, y=None):
        xp = self.xp
        n, t, e = x.shape
        h, d = self.heads, self._d
        x2 = x.reshape(n * t, e)
        qkv = x2 @ self.in_weight.data.T  # one GEMM for the three projections of every head
        if self.in_bias is not None:
            qkv += self.in_bias.data
        q, k, v = qkv.reshape(n, t, 3, h, d).transpose(2, 0, 3, 1, 4)  # each (N, h, T, d), views
        q = xp.multiply(q, q.dtype.type(self._scale))  # scaled once here: T·d products, not T·T
        s = xp.matmul(q, k.swapaxes(-1, -2), out=self.buffer("scores", (n, h, t, t), x.dtype))
        if self.causal:
            s += self._future(t, s.dtype)
        s -= s.max(axis=-1, keepdims=True)
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        a, mask = s, None
        if self.training and self.dropout > 0:
            a, mask = drop(self, s, self.dropout)
        o = xp.matmul(a, v, out=self.buffer("heads", (n, h, t, d), x.dtype))
        o2 = o.transpose(0, 2, 1, 3).reshape(n * t, h * d)  # heads side by side: one copy
        out = xp.matmul(o2, self.out_weight.data.T, out=self.buffer("y", (n * t, e), x.dtype))
        if self.out_bias is not None:
            out += self.out_bias.data
        self._cache = (x2, q, k, v, s, mask, a, o2)
        return out.reshape(n, t, e)

    def backward(self, dy):
        xp = self.xp
        x2, q, k, v, weights, mask, a, o2 = self._cache
        n, h, t, d = q.shape
        e = dy.shape[-1]
        dy2 = dy.reshape(n * t, e)
        xp.matmul(dy2.T, o2, out=self.out_weight.grad)
        if self.out_bias is not None:
            xp.matmul(self.buffers.ones(xp, n * t, dy.dtype), dy2, out=self.out_bias.grad)
        do = (dy2 @ self.out_weight.data).reshape(n, t, h, d).transpose(0, 2, 1, 3)  # (N, h, T, d)
        dqkv = xp.empty((n, t, 3, h, d), dtype=dy.dtype)
        dq, dk, dv = dqkv.transpose(2, 0, 3, 1, 4)  # views in the layout of qkv
        dv[...] = a.swapaxes(-1, -2) @ do
        da = xp.matmul(do, v.swapaxes(-1, -2), out=self.buffer("dweights", (n, h, t, t), dy.dtype))
        if mask is not None:
            da *= mask
        # softmax backward: dS = A ⊙ (dA − Σ_s dA ⊙ A); masked (future) entries have A = 0
        da -= (da * weights).sum(axis=-1, keepdims=True)
        da *= weights
        dq[...] = da @ k
        dq *= dq.dtype.type(self._scale)  # q was scaled before the product
        dk[...] = da.swapaxes(-1, -2) @ q  # (the scaled q)
        dqkv2 = dqkv.reshape(n * t, 3 * h * d)
        xp.matmul(dqkv2.T, x2, out=self.in_weight.grad)
        if self.in_bias is not None:
            xp.matmul(self.buffers.ones(xp, n * t, dy.dtype), dqkv2, out=self.in_bias.grad)
            # the key bias adds q·b_k to every score of a row, which the softmax ignores: its
            # gradient is exactly 0, and the sum above only rounding noise (which Adam, dividing
            # by its running size, would turn into full steps)
            self.in_bias.grad[h * d:2 * h * d] = 0
        if not self.needs_input_grad:
            return None
        return (dqkv2 @ self.in_weight.data).reshape(n, t, x2.shape[1])

    def _future(self, t: int, dtype):
        """The causal mask M (T × T): −inf above the diagonal, 0 elsewhere; made once per (T, dtype)."""
        return self.buffers.constant(self.xp, ("causal", t, np.dtype(dtype)),
                                     lambda: self.xp.asarray(np.triu(np.full((t, t), -np.inf, dtype), 1)))
