"""Deliberately broken layers: each has one planted backward bug that gradcheck must catch.

Not registered at import: tests register them temporarily (see ``registered`` in
test_gradcheck_broken.py). ``BUGS`` maps each class to the tensors gradcheck must name.
"""
from __future__ import annotations

import numpy as np

from dlrun.layers.activations import ReLU
from dlrun.layers.base import InputSpec, Layer
from dlrun.layers.embedding import Embedding
from dlrun.layers.large_margin import LargeMarginFC
from dlrun.layers.linear import Linear
from dlrun.layers.lsoftmax import LSoftmax
from dlrun.layers.requ import ReQU


class MissingFactor(ReQU):
    """ReQU whose backward forgot the factor 2 of d(x²)/dx."""

    def backward(self, dy):
        return dy * self._xpos


class TransposedWeightGrad(Linear):
    """Linear whose weight gradient is xᵀG (D, units) instead of Gᵀx (units, D)."""

    def backward(self, dy):
        self.weight.grad = self._x.T @ dy
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class IgnoredBranch(LargeMarginFC):
    """LargeMarginFC whose backward ignores the k branch (plain FC backward)."""

    def backward(self, dy):
        self.weight.grad[...] = dy.T @ self._x
        return dy @ self.weight.data


class _Correction(LargeMarginFC):
    """LargeMarginFC backward in the seed's correction form: plain FC plus (k−1)·G[i,y_i] terms."""

    coeff_sign = 1.0

    def backward(self, dy):
        x, w = self._x, self.weight.data
        dx = dy @ w
        dw = dy.T @ x
        if self._scale is not None:
            rows = np.flatnonzero(self._positive)  # the samples whose target logit was scaled
            cols = self._cols[rows]
            coeff = self.coeff_sign * (self.k - 1) * dy[rows, cols]
            dx[rows] += coeff[:, None] * w[cols]
            self.scatter(dw, cols, coeff[:, None] * x[rows])
        self.weight.grad[...] = dw
        return dx

    def scatter(self, dw, cols, values):
        np.add.at(dw, cols, values)


class WrongSign(_Correction):
    """(1 − k) instead of (k − 1)."""

    coeff_sign = -1.0


class DroppedRepeats(_Correction):
    """``dw[y] += v``: numpy keeps only one of the repeated labels' contributions."""

    def scatter(self, dw, cols, values):
        dw[cols] += values


class SeedWrongAxis(LargeMarginFC):
    """Seed 000's backward, bug 1 only: the label loop runs over X.shape[1] (D), not N."""

    def backward(self, dy):
        x, w, k = self._x, self.weight.data, self.k
        out_pos = self._positive if self._scale is not None else np.zeros(len(x), bool)
        label = self._label
        x_grad = dy @ w
        w_grad = dy.T @ x
        for i in range(x.shape[0]):
            yi = int(label[i])
            if out_pos[i]:
                x_grad[i] += (k * w[yi] - w[yi]) * dy[i, yi]
        for j in range(w.shape[0]):
            for i in range(x.shape[1]):  # the bug: D, not N
                yi = int(label[i])
                if yi == j and out_pos[i]:
                    w_grad[j] += (k * x[i] - x[i]) * dy[i, yi]
        self.weight.grad[...] = w_grad
        return x_grad

    def forward(self, x, y=None):
        self._label = y
        return super().forward(x, y)


class SeedBroadcast(SeedWrongAxis):
    """Seed 000's backward, bug 2 only: the correction is added to every class row of w_grad."""

    def backward(self, dy):
        x, w, k = self._x, self.weight.data, self.k
        out_pos = self._positive if self._scale is not None else np.zeros(len(x), bool)
        label = self._label
        x_grad = dy @ w
        w_grad = dy.T @ x
        for i in range(x.shape[0]):
            yi = int(label[i])
            if out_pos[i]:
                x_grad[i] += (k * w[yi] - w[yi]) * dy[i, yi]
        for j in range(w.shape[0]):
            for i in range(x.shape[0]):
                yi = int(label[i])
                if yi == j and out_pos[i]:
                    w_grad += (k * x[i] - x[i]) * dy[i, yi]  # the bug: whole matrix, not w_grad[j]
        self.weight.grad[...] = w_grad
        return x_grad


class ScaleShift(Layer):
    """y = x ⊙ scale + shift (a correct reference for WrongParam)."""

    input_spec = InputSpec(shape=("D",))

    def build(self, input_shape):
        self.scale = self.add_param("scale", input_shape, value=np.ones(input_shape))
        self.shift = self.add_param("shift", input_shape, value=np.zeros(input_shape))
        return tuple(input_shape)

    def forward(self, x, y=None):
        self._x = x
        return x * self.scale.data + self.shift.data

    def backward(self, dy):
        self.scale.grad[...] = (dy * self._x).sum(axis=0)
        self.shift.grad[...] = dy.sum(axis=0)
        return dy * self.scale.data


class WrongParam(ScaleShift):
    """The shift's gradient is written into scale.grad, and shift.grad is left stale."""

    def backward(self, dy):
        self.scale.grad[...] = dy.sum(axis=0)
        return dy * self.scale.data


class Accumulating(Linear):
    """Linear that accumulates (+=) into weight.grad instead of writing it."""

    def backward(self, dy):
        self.weight.grad += dy.T @ self._x
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class StaleCache(Linear):
    """Linear that caches its input only on the first forward."""

    def forward(self, x, y=None):
        if not hasattr(self, "_first"):
            self._first = x.copy()
        return super().forward(x)

    def backward(self, dy):
        self.weight.grad[...] = dy.T @ self._first
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class NotMultiplied(ReQU):
    """Adds a constant to the input gradient: backward(0) is not 0."""

    def backward(self, dy):
        return dy * 2 * self._xpos + 0.5


class InPlaceUpstream(ReQU):
    """Scales the upstream gradient in place (neon style): the caller's array changes."""

    def backward(self, dy):
        dy *= 2 * self._xpos
        return dy


class CopiedWeight(Linear):
    """Reads a copy of W taken at build time: perturbing the parameter never reaches the output."""

    def build(self, input_shape):
        out = super().build(input_shape)
        self._w = self.weight.data.copy()
        return out

    def forward(self, x, y=None):
        self._x = x
        return x @ self._w.T + self.bias.data


class UndeclaredBeta(LSoftmax):
    """LSoftmax annealing β without declaring it as state."""

    state = ()

    def __init__(self, units: int = 4, margin: int = 3, beta: float = 0.5, beta_min: float = 0.0,
                 scale: float = 0.5):
        super().__init__(units, margin, beta, beta_min, scale)


class ReusedOutput(ReQU):
    """Writes every output into one buffer kept across calls: a caller's earlier output changes."""

    def forward(self, x, y=None):
        self._xpos = x * (x > 0)
        if getattr(self, "_out", None) is None or self._out.shape != x.shape:
            self._out = np.empty_like(x)
        np.multiply(self._xpos, self._xpos, out=self._out)
        return self._out


class NaNForward(ReQU):
    """y = x·√x: NaN for every negative input (backward is that of the intended x^1.5)."""

    def forward(self, x):
        self._x = x
        with np.errstate(invalid="ignore"):
            return x * np.sqrt(x)

    def backward(self, dy):
        return dy * 1.5 * np.sqrt(np.abs(self._x))


class NaNBackward(Linear):
    """Linear whose input gradient has one NaN element."""

    def backward(self, dy):
        dx = super().backward(dy)
        dx[1, 1] = np.nan
        return dx


class WritesInput(ReQU):
    """ReQU that zeroes the negative entries of its input in place, then returns a copy: the
    output and gradients are right, the caller's x is not."""

    def forward(self, x):
        self._xpos = x * (x > 0)
        x *= x > 0
        return self._xpos * x

    def backward(self, dy):
        return 2 * dy * self._xpos


class NormalizesWeightInPlace(Linear):
    """Linear that renormalises W's rows in place on every forward (not repeatable)."""

    def forward(self, x):
        w = self.weight.data
        w /= np.linalg.norm(w, axis=1, keepdims=True)
        return super().forward(x)


class SmallScaleBug(Linear):
    """Linear scaled by 1e-6 whose input gradient is twice too large: every gradient is below
    atol, so only the float64 relative rule can see the bug."""

    def forward(self, x):
        return 1e-6 * super().forward(x)

    def backward(self, dy):
        dx = super().backward(1e-6 * dy)
        return 2 * dx


class OneElementBug(Linear):
    """Linear whose input gradient is wrong at one element in the middle of a large tensor."""

    input_spec = InputSpec(shape=("D",), options={"units": "C"})

    def backward(self, dy):
        dx = super().backward(dy)
        dx[len(dx) // 2, dx.shape[1] // 2] *= 3
        return dx


class ZeroesUsedRowsOnly(Embedding):
    """Embedding whose backward zeroes only the rows of the indices in the batch: the other rows
    keep the last step's gradient (passes a check whose every backward follows another one that
    wrote the same rows; training refuses it)."""

    def backward(self, dy):
        g = self.weight.grad
        g[np.unique(self._idx)] = 0
        self.backend.scatter_add(g, self._idx.reshape(-1), dy.reshape(-1, self.output_dim))
        return None


class ValueSignature(ReQU):
    """ReQU whose backward triples the gradient, with a branch signature that is the input itself:
    every perturbation changes it, so every difference is skipped and nothing is compared."""

    def backward(self, dy):
        return 3.0 * super().backward(dy)

    def branch_signature(self):
        return self._xpos


class BufferAccumulates(Linear):
    """Linear whose weight gradient is summed into a reused buffer without zeroing it: right in
    plain mode (a fresh array each call), wrong from training's second step on."""

    def backward(self, dy):
        dw = self.buffer("dw", self.weight.data.shape, dy.dtype)
        if dw is None:
            dw = np.zeros(self.weight.data.shape, dy.dtype)
        dw += dy.T @ self._x
        self.weight.grad[...] = dw
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class WritesThroughReshape(ReQU):
    """ReQU scaling its dx through reshape(-1): a view for C-ordered dy, a copy (the writes lost)
    for the Fortran-ordered or strided dy a transposing layer above can hand back."""

    def backward(self, dy):
        dx = dy * 1.0  # keeps dy's layout
        flat = dx.reshape(-1)
        flat *= 2 * self._xpos.reshape(-1)
        return dx


class ClobbersOutput(Layer):
    """Sigmoid whose backward turns the output forward returned (its cache) into y·(1 − y) in place:
    unusual but right, since training reads a layer's output before its backward. It was told it
    was 'stochastic without the seed hook'."""

    def forward(self, x):
        self._y = 1.0 / (1.0 + np.exp(-x))
        return self._y

    def backward(self, dy):
        y = self._y
        y *= 1 - y
        return dy * y


class FreesItsCache(ReQU):
    """A correct ReQU that drops its cache in backward, as PyTorch frees saved tensors."""

    def backward(self, dy):
        dx = super().backward(dy)
        self._xpos = None
        return dx


class UndeclaredPhase(Linear):
    """Linear that doubles its output in training, without declaring has_phase, and whose
    backward doubles in evaluation too: checked in training only, it passed."""

    def forward(self, x, y=None):
        return super().forward(x) * (2.0 if self.training else 1.0)

    def backward(self, dy):
        return super().backward(2.0 * dy)


class Float32Scratch(Linear):
    """Linear whose weight gradient is summed in a float32 scratch array (the seed's item 7): in a
    float64 check its errors, near 1e-7, pass the tolerances."""

    def backward(self, dy):
        dw = np.zeros(self.weight.data.shape, np.float32)
        dw += dy.T @ self._x
        self.weight.grad[...] = dw
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class KeepsFirstBatchBuffer(Layer):
    """y = 2x written into a buffer sized by the first batch it sees: the smaller last batch of
    an epoch raises in training (plain mode as well), which a new instance takes."""

    def forward(self, x):
        if getattr(self, "_buf", None) is None:
            self._buf = np.empty_like(x)
        np.multiply(x, 2.0, out=self._buf)
        return self._buf.copy()

    def backward(self, dy):
        return 2.0 * dy


class AccumulatesInBuffer(Linear):
    """Linear whose weight gradient is summed into a buffer of its own kept across calls
    (``self._dw += ...`` where ``=`` belongs): each backward adds the last one's gradient."""

    def build(self, input_shape):
        out = super().build(input_shape)
        self._dw = np.zeros_like(self.weight.data)
        return out

    def backward(self, dy):
        if self._dw.shape != self.weight.data.shape:
            self._dw = np.zeros_like(self.weight.data)
        self._dw += dy.T @ self._x
        self.weight.grad[...] = self._dw
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class AnnealsInBackward(Linear):
    """Linear scaled by a coefficient beta that backward anneals (beta *= 0.9) without declaring
    it in ``state``: right for the forward just run, but the layer is another function after
    every step, and checkpoints lose beta."""

    def __init__(self, units: int = 4, beta: float = 1.0):
        super().__init__(units)
        self.beta = beta

    def forward(self, x, y=None):
        return self.beta * super().forward(x)

    def backward(self, dy):
        dx = super().backward(self.beta * dy)
        self.beta *= 0.9
        return dx


class StaleMask(ReLU):
    """ReLU whose backward mask (its branch_signature too) is computed only when the batch shape
    changes: after the first batch of a shape it belongs to an earlier input."""

    def forward(self, x, y=None):
        if getattr(self, "_m", None) is None or self._m.shape != x.shape:
            self._m = x > 0
        return x * (x > 0)

    def backward(self, dy):
        return dy * self._m

    def branch_signature(self):
        return self._m


class AssignsTransposedGrad(Linear):
    """Linear writing xᵀ·dy into weight.grad in place: (D, units) into (units, D), which numpy
    refuses unless the weight is square (then it runs, transposed)."""

    def backward(self, dy):
        self.weight.grad[...] = self._x.T @ dy
        self.bias.grad[...] = dy.sum(axis=0)
        return dy @ self.weight.data


class ComputesInFloat32(Linear):
    """A correct Linear that computes in float32 whatever it is given, by design, and returns the
    input's dtype: a float64 check differences float32 rounding."""

    def forward(self, x, y=None):
        self._x = x
        w, b = self.weight.data.astype(np.float32), self.bias.data.astype(np.float32)
        return (x.astype(np.float32) @ w.T + b).astype(x.dtype)

    def backward(self, dy):
        g = dy.astype(np.float32)
        self.weight.grad[...] = g.T @ self._x.astype(np.float32)
        self.bias.grad[...] = g.sum(axis=0)
        return (g @ self.weight.data.astype(np.float32)).astype(dy.dtype)


BUGS = {  # class -> (tensors or aux checks that must FAIL, ones that must not)
    MissingFactor: ({"x"}, set()),
    TransposedWeightGrad: ({"weight", "grad-structure"}, {"x", "bias"}),
    IgnoredBranch: ({"x", "weight"}, set()),
    WrongSign: ({"x", "weight"}, set()),
    DroppedRepeats: ({"weight"}, {"x"}),
    SeedWrongAxis: ({"weight"}, set()),
    SeedBroadcast: ({"weight"}, {"x"}),
    WrongParam: ({"scale", "shift"}, {"x"}),
    # grad-structure names the +=; the checks it would fail as well (each with another guess at
    # the cause) judge the other tensors only
    Accumulating: ({"weight", "grad-structure"}, {"x", "bias", "reentrant", "zero-upstream", "fast-mode",
                                                  "non-contiguous"}),
    StaleCache: ({"weight", "second-point"}, {"x", "bias"}),
    NotMultiplied: ({"x", "zero-upstream"}, set()),
    InPlaceUpstream: ({"inputs-unchanged"}, set()),
    CopiedWeight: ({"weight", "wiring"}, {"bias"}),  # x too: backward uses the real W
    UndeclaredBeta: ({"state"}, set()),
    ReusedOutput: ({"output-aliasing"}, {"x"}),  # its gradients are right
    SmallScaleBug: ({"x"}, {"weight", "bias"}),
    NaNForward: ({"x", "output-finite"}, set()),
    NaNBackward: ({"x"}, {"weight", "bias", "reentrant"}),
    WritesInput: ({"inputs-unchanged"}, set()),
    NormalizesWeightInPlace: ({"inputs-unchanged"}, set()),
    ZeroesUsedRowsOnly: ({"weight", "grad-structure"}, {"reentrant", "zero-upstream"}),
    ValueSignature: ({"kink-skips"}, set()),
    BufferAccumulates: ({"fast-mode"}, {"weight", "bias", "x", "reentrant"}),
    WritesThroughReshape: ({"non-contiguous"}, {"x"}),
    UndeclaredPhase: ({"x", "weight", "bias"}, set()),
    Float32Scratch: ({"weight", "grad-structure"}, {"x", "bias"}),
    KeepsFirstBatchBuffer: ({"fast-mode"}, {"x"}),
    # a layer that does not repeat itself fails the checks comparing two of its calls as well: those
    # follow from the root cause (n/a), and are not blamed on causes of their own
    AccumulatesInBuffer: ({"weight", "reentrant"}, {"x", "bias", "zero-upstream", "fast-mode", "non-contiguous"}),
    AnnealsInBackward: ({"state", "reentrant"}, {"zero-upstream", "fast-mode", "non-contiguous"}),
    StaleMask: ({"x", "state"}, {"kink-skips"}),
    AssignsTransposedGrad: ({"weight", "grad-structure"}, {"bias"}),  # (backward raised: x is not compared)
}
CORRECT = [FreesItsCache, ClobbersOutput]  # unusual but right: they must PASS
