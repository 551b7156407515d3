"""The training fast path: buffer reuse, skipped input gradients, fused softmax-CE, blocked SGD.

Oracles: float64 closed forms, central differences, hand-computed optimizer steps, and the
same model run outside the fast path.
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.config import config_from_dict
from dlrun.errors import LayerError
from dlrun.layers.base import Layer, Parameter
from dlrun.model import Sequential
from dlrun.optimizers import SGD
from dlrun.runs.assembly import assemble
from dlrun.training.trainer import Trainer, predict
from layer_numgrad import make


def mlp(dtype=np.float64, first=None, seed=0):
    specs = ([first] if first else []) + [{"type": "Linear", "units": 4}, "ReLU", {"type": "Linear", "units": 3}]
    return Sequential([registry.layers.build(s) for s in specs], (3,), dtype=dtype, seed=seed)


def loss_of(model, x, y):
    return float(registry.losses.build("SoftmaxCrossEntropy").forward(model.forward(x), y))


@pytest.mark.parametrize("classes", [3, 40])  # column-wise path (<= 16) and the axis-1 path
@pytest.mark.parametrize("pooled", [False, True])
def test_softmax_cross_entropy_matches_float64_closed_form(classes, pooled):
    rng = np.random.default_rng(classes)
    z = (50 * rng.standard_normal((7, classes))).astype(np.float32)  # large logits: no overflow
    y = rng.integers(0, classes, 7)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    loss.buffers.enabled = pooled
    z64 = z.astype(np.float64)
    m = z64.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z64 - m).sum(axis=1)) + m[:, 0]
    p = np.exp(z64 - lse[:, None])
    onehot = np.eye(classes)[y]
    for _ in range(2):  # a second call must not see stale buffer contents
        value = loss.forward(z, y)
        d = loss.backward()
        assert value.dtype == np.float32 and d.dtype == np.float32
        np.testing.assert_allclose(float(value), np.mean(lse - z64[np.arange(7), y]), rtol=1e-5)
        np.testing.assert_allclose(d, (p - onehot) / 7, atol=1e-6)


@pytest.mark.parametrize("label_dtype", [np.uint8, np.int16, np.int32])
def test_softmax_cross_entropy_takes_narrow_integer_labels(label_dtype):
    """Labels index the n·c flat scores: in their own dtype the offsets wrapped (uint8 raised
    OverflowError at 300 classes). The trainer always passes int64; the API need not."""
    rng = np.random.default_rng(1)
    z = rng.standard_normal((20, 300))
    y = rng.integers(0, 250, 20)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    value = loss.forward(z, y.astype(label_dtype))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert float(value) == pytest.approx(-np.log(p[np.arange(20), y]).mean(), rel=1e-12)
    np.testing.assert_allclose(loss.backward(), (p - np.eye(300)[y]) / 20, atol=1e-15)


def test_pooled_softmax_cross_entropy_follows_the_batch_shape():
    """Cached row offsets and buffers are per shape: a partial last batch, then fewer classes."""
    rng = np.random.default_rng(5)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    loss.buffers.enabled = True
    for n, c in ((8, 3), (5, 3), (8, 3), (5, 2)):
        z, y = rng.standard_normal((n, c)).astype(np.float32), rng.integers(0, c, n)
        value, d = float(loss.forward(z, y)), loss.backward()
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(value, -np.log(p[np.arange(n), y]).mean(), rtol=1e-5)
        np.testing.assert_allclose(d, (p - np.eye(c)[y]) / n, atol=1e-6)


def test_pooled_softmax_cross_entropy_reads_every_logits_array_afresh():
    """Column views are cached for the last logits array seen: values written into that same
    array, and another array of the same shape, must both be read anew."""
    rng = np.random.default_rng(6)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    loss.buffers.enabled = True
    y = rng.integers(0, 4, 6)
    same = np.empty((6, 4), np.float32)
    for z in (rng.standard_normal((6, 4)), rng.standard_normal((6, 4)), None, None):
        if z is None:  # the training loop's case: the last layer rewrites one buffer
            same[...] = 3 * rng.standard_normal((6, 4))
            z = same
        z = z.astype(np.float32, copy=False)
        lse = np.log(np.exp(z.astype(np.float64)).sum(axis=1))
        np.testing.assert_allclose(float(loss.forward(z, y)), np.mean(lse - z[np.arange(6), y]), rtol=1e-5)


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("classes", [3, 40])
def test_softmax_cross_entropy_counts_correct_predictions_exactly_as_argmax(classes, pooled):
    """Its count from the forward's row maxima equals argmax's, also with exact ties (first
    maximum wins), near-ties that round exp(z - m) to 1, NaN rows, and when asked about other arrays."""
    rng = np.random.default_rng(classes)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    loss.buffers.enabled = pooled
    y = rng.integers(0, classes, 12)
    plain = rng.standard_normal((12, classes)).astype(np.float32)
    tied = plain.copy()
    tied[:4] = 0.0  # a dead network's logits: argmax says class 0 for these rows
    tied[4, :2] = tied[4].max() + 1  # a tie between the first two columns only
    near = np.full((12, classes), -1.0, np.float32)
    near[:, 1] = 1e-3
    near[:, 0] = np.nextafter(np.float32(1e-3), np.float32(-1))  # column 1 is the unique max ...
    assert np.exp(near[:, 0] - near[:, 1]).min() == 1.0  # ... but exp(z - m) rounds to 1 in both
    nan = plain.copy()
    nan[3, 1] = np.nan
    for z in (plain, tied, near, nan):
        labels = y.copy()
        labels[:6] = rng.integers(0, 2, 6)  # many labels on the tied columns
        expected = int((z.argmax(axis=1) == labels).sum())
        loss.forward(z, labels)
        assert int(loss.count_correct(z, labels)) == expected
        other = rng.standard_normal(z.shape).astype(np.float32)  # not what forward saw: argmax of it
        assert int(loss.count_correct(other, labels)) == int((other.argmax(axis=1) == labels).sum())


def test_train_step_returns_the_batch_loss_sum_and_correct_count_before_the_update():
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((9, 3)).astype(np.float32), rng.integers(0, 3, 9)
    model = mlp(np.float32)
    out = model.forward(x)
    expected_loss = 9 * loss_of(model, x, y)
    expected_correct = int((out.argmax(axis=1) == y).sum())
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), SGD(0.1), batch_size=9)
    total, correct = trainer.train_step(x, y)
    assert float(total) == pytest.approx(expected_loss, rel=1e-6) and int(correct) == expected_correct
    assert trainer.step == 1 and loss_of(model, x, y) != pytest.approx(expected_loss / 9)  # the step updated


def test_fast_training_gradients_match_central_differences():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((6, 3)), rng.integers(0, 3, 6)
    model = mlp()
    loss = registry.losses.build("SoftmaxCrossEntropy")
    model.train(fast=True)
    loss.buffers.enabled = True
    loss.forward(model.forward(x), y)
    assert model.backward(loss.backward()) is None  # nothing computes the input gradient
    assert model.layers[0].needs_input_grad is False and model.layers[2].needs_input_grad is True
    grads = {n: p.grad.copy() for n, p in model.named_parameters()}
    model.train()
    for name, p in model.named_parameters():
        num = np.zeros_like(p.data)
        for i in np.ndindex(p.data.shape):
            old = p.data[i]
            p.data[i] = old + 1e-6
            up = loss_of(model, x, y)
            p.data[i] = old - 1e-6
            down = loss_of(model, x, y)
            p.data[i] = old
            num[i] = (up - down) / 2e-6
        np.testing.assert_allclose(grads[name], num, atol=1e-7, err_msg=name)


def test_leading_layers_without_parameters_are_skipped_in_fast_backward():
    model = mlp(first="ReLU")
    model.train(fast=True)
    assert [layer.needs_input_grad for layer in model.layers] == [False, False, True, True]
    model.train()
    assert all(layer.needs_input_grad for layer in model.layers)
    dx = model.backward(model.forward(np.ones((2, 3))))
    assert dx.shape == (2, 3)


def test_buffers_reused_per_shape_only_in_fast_mode():
    model = mlp(np.float32)
    x = np.ones((5, 3), np.float32)
    assert model.forward(x) is not model.forward(x)  # default: fresh outputs
    model.train(fast=True)
    a = model.forward(x)
    assert model.forward(x) is a
    b = model.forward(x[:2])  # the last partial batch: the first rows of the same memory
    assert b is not a and b.shape == (2,) + a.shape[1:] and np.shares_memory(a, b)
    assert model.forward(x) is a
    model.train()


def test_predict_outputs_are_independent_of_buffers():
    rng = np.random.default_rng(2)
    model = mlp(np.float32)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    model.train(fast=True)  # as after an interrupted fit: predict must still switch it off
    full = predict(model, x)
    by_two = predict(model, x, batch_size=2)
    np.testing.assert_allclose(by_two, full, rtol=1e-6)
    assert len({r.tobytes() for r in by_two}) == 6


class Scale(Layer):
    """y = x ⊙ s: a hand-written layer that ignores buffers and needs_input_grad, and replaces
    param.grad with a new array on every backward."""

    def build(self, input_shape):
        self.s = self.add_param("s", input_shape, value=np.full(input_shape, 0.5))
        return input_shape

    def forward(self, x, y=None):
        self._x = x
        return x * self.s.data

    def backward(self, dy):
        self.s.grad = (dy * self._x).sum(axis=0)
        return dy * self.s.data


def test_hand_written_layer_that_ignores_the_fast_path_trains():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((40, 3)).astype(np.float32), rng.integers(0, 3, 40)
    layers = [Scale()] + [registry.layers.build(s) for s in ({"type": "Linear", "units": 8}, "ReLU",
                                                              {"type": "Linear", "units": 3})]
    model = Sequential(layers, (3,), seed=0)
    opt = SGD(learning_rate=0.1, momentum=0.9)
    opt.block_size = 2  # blocks of a parameter whose grad array is replaced every step
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), opt, batch_size=16, seed=0)
    s_before = model.layers[0].s.data.copy()
    hist = trainer.fit(x, y, epochs=30)
    assert hist.rows[-1]["train_loss"] < 0.8 * hist.rows[0]["train_loss"]
    assert not np.allclose(model.layers[0].s.data, s_before)
    assert all(p.data.dtype == np.float32 for _, p in model.named_parameters())


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("block_size", [5, 1 << 17])
def test_sgd_momentum_in_blocks_matches_hand_computed_steps(nesterov, block_size):
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal((3, 4))
    g1, g2 = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p = Parameter(w0.astype(np.float32), np.zeros((3, 4), np.float32))
    opt = SGD(learning_rate=0.1, momentum=0.9, nesterov=nesterov)
    opt.block_size = block_size
    opt.setup([("w", p)])
    w, v = w0.copy(), np.zeros((3, 4))
    for g in (g1, g2):
        p.grad[...] = g
        opt.step()
        v = 0.9 * v + g
        w = w - 0.1 * ((g + 0.9 * v) if nesterov else v)
    np.testing.assert_allclose(p.data, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt.state["w"]["velocity"], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", [{"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
                                  {"type": "Adam", "weight_decay": 0.01}, {"type": "AdamW"},
                                  {"type": "RMSProp", "momentum": 0.5}, {"type": "AdaGrad"}])
def test_blocked_update_equals_whole_array_update(spec):
    """Cache-blocked elementwise updates give bit-identical results to one whole-array update."""

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((37, 11)).astype(np.float32)
    grads = [rng.standard_normal(w0.shape).astype(np.float32) for _ in range(3)]
    results = []
    for block in (10**9, 50):
        opt = registry.optimizers.build(spec)
        opt.block_size = block
        p = Parameter(w0.copy(), np.zeros_like(w0))
        opt.setup([("w", p)])
        for g in grads:
            p.grad[...] = g
            opt.step()
        results.append(p.data)
    assert np.array_equal(results[0], results[1])


class Fails(Layer):
    """Identity that raises on its n-th training forward."""

    def __init__(self, at: int = 3):
        self.at, self.calls = at, 0

    def forward(self, x, y=None):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("boom")
        return x

    def backward(self, dy):
        return dy


@pytest.mark.parametrize("fails", [False, True])
def test_fit_leaves_the_model_and_loss_in_plain_mode(fails):
    """fit holds the fast mode across epochs when nothing outside the loop looks, and always leaves it."""
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((12, 3)).astype(np.float32), rng.integers(0, 3, 12)
    layers = [registry.layers.build({"type": "Linear", "units": 4}), Fails(3 if fails else 10**9),
              registry.layers.build("ReLU"), registry.layers.build({"type": "Linear", "units": 3})]
    model = Sequential(layers, (3,), seed=0)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), SGD(learning_rate=0.1), batch_size=None)
    if fails:
        with pytest.raises(LayerError, match=r"model\[1\] .*: forward raised RuntimeError: boom \(test_fast_path.py:\d+\)"):
            trainer.fit(x, y, epochs=5)
    else:
        trainer.fit(x, y, epochs=5)
    assert all(layer.training and not layer.buffers.enabled and layer.needs_input_grad for layer in model.layers)
    assert not trainer.loss.buffers.enabled
    first = model.forward(x)
    assert model.forward(2 * x) is not first  # plain mode: a new output array per call


def test_pooled_softmax_cross_entropy_reads_a_strided_logits_buffer_afresh():
    """A last layer may hand the loss a transposed view of a buffer it rewrites: the loss must
    not keep a flattened copy of it between calls, and a gradient kept from a plain-mode call
    must not be overwritten once the pool is enabled."""
    rng = np.random.default_rng(11)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    y = rng.integers(0, 3, 5)
    kept = (loss.forward(rng.standard_normal((5, 3)).astype(np.float32), y), loss.backward())[1]
    before = kept.copy()
    loss.buffers.enabled = True
    buf = np.empty((3, 5), np.float32)
    z = buf.T  # one strided view object, new values in its memory before each call
    for _ in range(3):
        buf[...] = 4 * rng.standard_normal((3, 5))
        lse = np.log(np.exp(z.astype(np.float64)).sum(axis=1))
        np.testing.assert_allclose(float(loss.forward(z, y)), np.mean(lse - z[np.arange(5), y]), rtol=1e-5)
        loss.backward()
    np.testing.assert_array_equal(kept, before)


def test_relu_in_fast_mode_gives_dx_in_its_mask_buffer_and_leaves_the_upstream_gradient_alone():
    """In fast mode ReLU's backward writes dx into its mask's buffer: the values are the plain
    mode's over batches of two sizes, the upstream gradient is never written (a graph may pass one
    gradient to two nodes), and each forward writes a fresh mask."""
    rng = np.random.default_rng(3)
    plain, fast = registry.layers.build("ReLU"), registry.layers.build("ReLU")
    for layer in (plain, fast):
        make(layer, (5,), np.float32)
    fast.buffers.enabled = True
    for n in (6, 6, 4, 6):
        x = rng.standard_normal((n, 5)).astype(np.float32)
        x[0, :2] = 0.0, np.nan  # the kink takes the 0 branch; NaN's mask is 0 in both modes
        dy = rng.standard_normal((n, 5)).astype(np.float32)
        kept = dy.copy()
        np.testing.assert_array_equal(fast.forward(x), plain.forward(x))
        dx = fast.backward(dy)
        np.testing.assert_array_equal(dx, plain.backward(dy))
        np.testing.assert_array_equal(dy, kept)
        assert not np.shares_memory(dx, dy)


def test_relu_after_a_linear_writes_over_its_input_in_fast_mode_only():
    """In fast mode a ReLU that follows a Linear (whose backward never reads its output) writes its
    output over the Linear's, and a Linear after the ReLU (whose backward reads the mask, not the
    output) its dx over its input; a ReLU that reads the batch, or follows a layer that keeps its
    output (Sigmoid's backward reads it), gets an array of its own, and so does every layer outside
    fast mode. Training gives the same weights, bit for bit, as without the overwrites."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    model = mlp(np.float32)
    model.train(fast=True)
    assert [layer.owns_input for layer in model.layers] == [False, True, True]
    linear, relu, last = model.layers
    h = linear.forward(x)
    expected = np.maximum(h, 0)
    out = relu.forward(h)
    assert out is h and np.array_equal(out, expected)
    last.forward(out)
    dz = rng.standard_normal((6, 3)).astype(np.float32)
    expected = dz @ last.weight.data
    dx = last.backward(dz)
    assert np.shares_memory(dx, h) and np.allclose(dx, expected, rtol=1e-6)
    model.train()
    assert not any(layer.owns_input for layer in model.layers)
    h = linear.forward(x)
    assert not np.shares_memory(relu.forward(h), h)

    first = mlp(np.float32, first="ReLU")  # the batch itself is never written
    first.train(fast=True)
    assert [layer.owns_input for layer in first.layers] == [False, True, True, True]
    kept = x.copy()
    first.forward(x)
    np.testing.assert_array_equal(x, kept)
    after_sigmoid = Sequential([registry.layers.build(s) for s in
                                [{"type": "Linear", "units": 4}, "Sigmoid", "ReLU", {"type": "Linear", "units": 3}]],
                               (3,), dtype=np.float32, seed=0)
    after_sigmoid.train(fast=True)
    assert after_sigmoid.layers[2].owns_input is False

    def trained(overwrite: bool):
        m = mlp(np.float32, seed=5)
        if not overwrite:  # (as if Linear and ReLU read their outputs again)
            m.layers[0].keeps_output = m.layers[1].keeps_output = True
        t = Trainer(m, registry.losses.build("SoftmaxCrossEntropy"), SGD(0.5, momentum=0.9), batch_size=4)
        t.fit(x, rng_labels, epochs=5)
        return {k: v.copy() for k, v in m.state_arrays().items()}

    rng_labels = rng.integers(0, 3, 6)
    with_overwrite, without = trained(True), trained(False)
    assert with_overwrite.keys() == without.keys()
    for k in with_overwrite:
        np.testing.assert_array_equal(with_overwrite[k], without[k], err_msg=k)


def test_no_node_of_a_graph_writes_over_its_input():
    """A graph node's output may feed several nodes: no node owns its input, fast mode or not."""
    cfg = config_from_dict({"seed": 0, "data": {"type": "spiral", "points_per_class": 3},
                            "model": [{"type": "Linear", "units": 4, "name": "a"},
                                      {"type": "ReLU", "inputs": ["a"], "name": "r"},
                                      {"type": "Add", "inputs": ["a", "r"]}, {"type": "Linear", "units": 3}],
                            "loss": "SoftmaxCrossEntropy", "optimizer": {"type": "SGD", "learning_rate": 0.1}})
    run = assemble(cfg)
    model = run.trainer.model
    assert type(model).__name__ == "Graph"
    model.train(fast=True)
    assert not any(layer.owns_input for layer in model.layers)
    run.trainer.fit(run.data.x, run.data.y, epochs=2)  # trains (a ReLU writing over "a" would change Add's input)
