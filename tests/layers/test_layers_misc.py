"""ELU, GELU, Softplus, LogSoftmax, Embedding, Flatten and Reshape: closed forms, stability,
float64 gradient checks and edge shapes."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlrun.errors import ConfigError, DataError, ShapeError
from dlrun.registry import layers
from layer_numgrad import check_gradients, make


def built(spec, shape, dtype=np.float64):
    layer = layers.build(spec)
    return layer, make(layer, shape, dtype)


X = np.random.default_rng(0).standard_normal((4, 7)) * 3


def test_elu_closed_form_and_gradients():
    layer, _ = built({"type": "ELU", "alpha": 0.7}, (7,))
    y = layer.forward(X)
    np.testing.assert_allclose(y, np.where(X > 0, X, 0.7 * (np.exp(X) - 1)))
    check_gradients(layer, X)
    big, _ = built("ELU", (2,), np.float32)
    assert np.isfinite(big.forward(np.array([[1e4, -1e4]], np.float32))).all()


def test_elu_float32_keeps_relative_precision_in_both_tails():
    # Near 0, alpha·(exp(x) − 1) cancels; far below 0, y + alpha rounds to 0 in float32 although
    # the true slope alpha·exp(x) is a normal float32 number. Both must stay within a few ulps.
    layer, _ = built({"type": "ELU", "alpha": 0.7}, (4,), np.float32)
    x = np.array([[-30.0, -20.0, -1e-4, -3e-7]], np.float32)
    x64 = x.astype(np.float64)[0]
    y = layer.forward(x)
    g = layer.backward(np.ones_like(x))
    assert y.dtype == g.dtype == np.float32
    np.testing.assert_allclose(y[0], [0.7 * math.expm1(v) for v in x64], rtol=1e-6)
    np.testing.assert_allclose(g[0], [0.7 * math.exp(v) for v in x64], rtol=1e-6)


# GELU at points in every region of the erf/erfc approximations (|x|/√2 below 0.84375, up to
# 1.25, up to 1/0.35, beyond) and far into the tails
X_GELU = np.array([[-40.0, -12.0, -6.5, -3.9, -2.2, -1.5, -0.9, -1e-9, 0.0],
                   [3e-8, 0.4, 1.2, 1.7, 2.5, 3.5, 5.0, 9.0, 41.0]])


def _gelu_oracle(x):  # test-only: Python's math.erfc, element by element
    return x * np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2)))(x)


def test_gelu_default_is_exact():
    layer, _ = built("GELU", (9,))
    y = layer.forward(X_GELU)
    # rtol: x/√2 itself is rounded, and in the tail erfc's relative error is ~u² times that
    np.testing.assert_allclose(y, _gelu_oracle(X_GELU), rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(layer.forward(X), _gelu_oracle(X), rtol=1e-14, atol=1e-16)
    assert check_gradients(layer, X) > 0
    assert check_gradients(layer, X_GELU[:, 1:-1]) > 0  # every region, tails excluded by h
    f32, _ = built("GELU", (9,), np.float32)
    y32 = f32.forward(X_GELU.astype(np.float32))
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, _gelu_oracle(X_GELU), rtol=1e-5, atol=1e-30)  # (same, u²·eps32)


def test_gelu_tanh_approximation_and_close_to_exact():
    layer, _ = built({"type": "GELU", "approximate": "tanh"}, (7,))
    y = layer.forward(X)
    c = math.sqrt(2 / math.pi)
    np.testing.assert_allclose(y, 0.5 * X * (1 + np.tanh(c * (X + 0.044715 * X ** 3))), rtol=1e-14)
    assert 1e-5 < np.abs(y - _gelu_oracle(X)).max() < 5e-4  # an approximation, and a close one
    check_gradients(layer, X)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ConfigError, match=r"approximate.*one of 'none', 'tanh'.*got 'exact'"):
        layers.build({"type": "GELU", "approximate": "exact"})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch_when_available(approximate):
    torch = pytest.importorskip("torch")
    layer, _ = built({"type": "GELU", "approximate": approximate}, (7,))
    t = torch.tensor(X, requires_grad=True)
    ref = torch.nn.functional.gelu(t, approximate=approximate)
    dy = np.random.default_rng(3).standard_normal(X.shape)
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(layer.forward(X), ref.detach().numpy(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(layer.backward(dy), t.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_softplus_stable_and_gradients():
    for beta in (1.0, 2.5):
        layer, _ = built({"type": "Softplus", "beta": beta}, (7,))
        np.testing.assert_allclose(layer.forward(X), np.log1p(np.exp(beta * X)) / beta, rtol=1e-12)
        check_gradients(layer, X)
    layer, _ = built("Softplus", (3,), np.float32)
    x = np.array([[-1000.0, 0.0, 1000.0]], np.float32)
    y = layer.forward(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, [[0.0, math.log(2), 1000.0]], rtol=1e-6)
    np.testing.assert_allclose(layer.backward(np.ones_like(y)), [[0.0, 0.5, 1.0]])


def test_logsoftmax_closed_form_stability_and_gradients():
    layer, _ = built("LogSoftmax", (7,))
    y = layer.forward(X)
    np.testing.assert_allclose(np.exp(y).sum(axis=1), 1.0)
    np.testing.assert_allclose(y, X - np.log(np.exp(X).sum(axis=1, keepdims=True)), rtol=1e-12)
    check_gradients(layer, X)
    layer32, _ = built("LogSoftmax", (3,), np.float32)
    y = layer32.forward(np.array([[1000.0, 0.0, -1000.0]], np.float32))
    assert y.dtype == np.float32 and np.isfinite(y).all()
    np.testing.assert_allclose(y, [[0.0, -1000.0, -2000.0]])


def test_embedding_lookup_and_repeated_indices_scatter_add():
    layer, out = built({"type": "Embedding", "input_dim": 5, "output_dim": 3}, (4,))
    assert out == (4, 3)
    idx = np.array([[0, 2, 2, 4], [2, 0, 1, 2]], dtype=np.float64)  # floats, as a model passes them
    y = layer.forward(idx)
    w = layer.weight.data
    np.testing.assert_array_equal(y, w[idx.astype(int)])
    dy = np.random.default_rng(0).standard_normal(y.shape)
    dx = layer.backward(dy)
    assert dx.shape == idx.shape and not dx.any()
    ref = np.zeros_like(w)
    for n in range(2):
        for t in range(4):
            ref[int(idx[n, t])] += dy[n, t]
    np.testing.assert_allclose(layer.weight.grad, ref)  # index 2 appears four times
    assert not layer.weight.grad[3].any()
    check_gradients(layer, idx, wrt_input=False)


def test_embedding_rejects_out_of_range_indices():
    layer, _ = built({"type": "Embedding", "input_dim": 5, "output_dim": 3}, (2,))
    with pytest.raises(DataError, match=r"index 5 is outside \[0, 5\)"):
        layer.forward(np.array([[0.0, 5.0]]))
    with pytest.raises(DataError, match="index -1"):
        layer.forward(np.array([[-1.0, 0.0]]))


def test_embedding_float32():
    layer, _ = built({"type": "Embedding", "input_dim": 6, "output_dim": 2}, (3,), np.float32)
    y = layer.forward(np.array([[1, 1, 5]], np.float32))
    layer.backward(np.ones_like(y))
    assert y.dtype == layer.weight.grad.dtype == np.float32
    np.testing.assert_array_equal(layer.weight.grad[1], [2, 2])


def test_flatten_and_reshape_round_trip():
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5))
    flat, out = built("Flatten", (3, 4, 5))
    assert out == (60,)
    y = flat.forward(x)
    np.testing.assert_array_equal(y, x.reshape(2, 60))
    np.testing.assert_array_equal(flat.backward(y), x)
    check_gradients(flat, x)
    back, out = built({"type": "Reshape", "target_shape": [3, -1]}, (60,))
    assert out == (3, 20)
    z = back.forward(y)
    assert z.shape == (2, 3, 20)
    np.testing.assert_array_equal(back.backward(z), y)
    check_gradients(back, y)


def test_reshape_errors():
    with pytest.raises(ShapeError, match="cannot reshape"):
        built({"type": "Reshape", "target_shape": [7, -1]}, (60,))
    with pytest.raises(ShapeError, match="cannot reshape"):
        built({"type": "Reshape", "target_shape": [5, 5]}, (60,))
    with pytest.raises(ConfigError, match="one -1"):
        layers.build({"type": "Reshape", "target_shape": [-1, -1]})


CATALOGUE = ["Conv2D", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D", "Flatten", "Reshape", "BatchNorm", "LayerNorm",
             "Dropout", "ELU", "GELU", "Softplus", "LogSoftmax", "Embedding"]
DIMS = {"C": 3, "H": 6, "W": 5, "D": 4, "T": 5}


@pytest.mark.parametrize("name", CATALOGUE)
def test_input_spec_builds_and_float32_path_neither_upcasts_nor_mutates(name):
    """Each layer's declared input_spec (used by gradcheck and the contract test) builds the
    layer; in float32, forward/backward/gradients stay float32 and leave x and dy untouched."""
    cls = layers.get(name)
    spec = cls.input_spec
    opts = {k: DIMS.get(v, v) if isinstance(v, str) else v for k, v in spec.options.items()}
    shape = tuple(DIMS.get(s, s) for s in spec.shape)
    layer, out_shape = built({"type": name, **opts}, shape, np.float32)
    rng = np.random.default_rng(0)
    if spec.kind == "index":
        high = DIMS.get(spec.high, spec.high)
        x = rng.integers(0, high, (2,) + shape).astype(np.float32)
    else:
        x = rng.standard_normal((2,) + shape).astype(np.float32)
    x0 = x.copy()
    y = layer.forward(x)
    assert y.shape == (2,) + out_shape and y.dtype == np.float32
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dy0 = dy.copy()
    dx = layer.backward(dy)
    assert dx.shape == x.shape and dx.dtype == np.float32
    for p in layer.params.values():
        assert p.data.dtype == np.float32 and (p.grad is None or p.grad.dtype == np.float32)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


def _emulated_kernel(name):
    """numpy stand-ins for Embedding's two GPU kernels, with the semantics their CUDA source
    states (the GPU tests run the real ones): the Python side is tested here on the CPU."""
    def rows(x, D):
        ok = (x > -1) & (x < D)
        return ok, np.where(ok, x, 0).astype(np.int64)

    if name == "dlrun_embedding":
        def gather(W, x, c, D, C, nan, out):
            ok, v = rows(x, D)
            out[...] = np.where(ok, W.reshape(-1)[v * C + c], nan)
            return out
        return gather
    assert name == "dlrun_embedding_grad"

    def scatter(x, c, dy, D, C, G):
        ok, v = rows(x, D)
        ok, flat = np.broadcast_arrays(ok, v * C + c)
        np.add.at(G.reshape(-1), flat[ok], dy[ok])
    return scatter


def _embedding_fit(x, y, epochs=2):
    from dlrun import registry
    from dlrun.backend import CPU
    from dlrun.model import Sequential
    from dlrun.training.trainer import Trainer

    specs = [{"type": "Embedding", "input_dim": 10, "output_dim": 4}, "Flatten", {"type": "Linear", "units": 3}]
    model = Sequential([registry.layers.build(s) for s in specs], (5,), CPU, np.float32, seed=0)
    trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"),
                      batch_size=4, shuffle=False)
    start = model.layers[0].weight.data.copy()
    try:
        return [r["train_loss"] for r in trainer.fit(x, y, epochs=epochs).rows], model, start
    except DataError as e:
        return e, model, start


def test_embedding_unchecked_training_lookup_defers_a_bad_index_to_the_epoch_check(monkeypatch):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (12, 5)).astype(np.float32)
    y = rng.integers(0, 3, 12)
    checked, _, _ = _embedding_fit(x, y)
    import dlrun.layers.embedding as emb

    names = []
    for kernel in (emb._GATHER, emb._SCATTER):
        monkeypatch.setattr(kernel, "on", lambda xp, k=kernel: names.append(k.name) or _emulated_kernel(k.name))
    unchecked, _, _ = _embedding_fit(x, y)  # the GPU code path, on the CPU
    assert names.count("dlrun_embedding") == names.count("dlrun_embedding_grad") == 6  # 2 epochs x 3 batches
    np.testing.assert_allclose(unchecked, checked, rtol=1e-6)  # same lookup and scatter-add
    bad = x.copy()
    bad[6, 2] = 12  # batch 2 of epoch 1
    err, model, start = _embedding_fit(bad, y)
    assert isinstance(err, DataError) and "index 12 is outside [0, 10)" in str(err), err
    np.testing.assert_array_equal(model.layers[0].weight.data, start)  # the replay restored the weights
    # after a trainable layer, the unchecked path still returns dx (zeros shaped like x)
    layer, _ = built({"type": "Embedding", "input_dim": 10, "output_dim": 4}, (5,), np.float32)
    layer.buffers.enabled = True
    out = layer.forward(x[:3])
    assert names[-1] == "dlrun_embedding" and out.shape == (3, 5, 4)
    dx = layer.backward(np.ones_like(out))
    assert dx.shape == (3, 5) and dx.dtype == np.float32 and not dx.any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_free_activations_equal_the_where_forms_bit_for_bit(dtype):
    """LeakyReLU, ELU and Softplus select branches arithmetically (np.where costs ~40x a multiply
    on the CPU); outputs and gradients must equal the plain where() forms exactly, special values
    included, in plain and fast (buffered) mode."""
    from dlrun.backend import CPU
    from dlrun.registry import layers

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(500) * 4, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, -90, 90]])
    x = x.astype(dtype).reshape(1, -1)
    dy = rng.standard_normal(x.shape).astype(dtype)
    one = dtype(1)

    def leaky(s):
        scale = np.where(x > 0, one, dtype(s))
        return x * scale, dy * scale

    def elu(a):
        neg = np.minimum(x, 0)
        return np.where(x > 0, x, dtype(a) * np.expm1(neg)), dy * np.where(x > 0, one, dtype(a) * np.exp(neg))

    def softplus(b):
        bx = x * b if b != 1.0 else x
        e = np.exp(-np.abs(bx))
        sig = np.where(bx >= 0, 1 / (1 + e), e / (1 + e))
        return np.log1p(e) * (1.0 / b if b != 1.0 else 1.0) + np.maximum(x, 0), dy * sig

    with np.errstate(all="ignore"):  # inf·0 and friends, in the references and the layers alike
        cases = [({"type": "LeakyReLU", "slope": s}, leaky(s)) for s in (0.0, 0.01, 1.0, 2.5)]
        cases += [({"type": "ELU", "alpha": a}, elu(a)) for a in (0.0, 0.5, 1.0, 2.0)]
        cases += [({"type": "Softplus", "beta": b}, softplus(b)) for b in (1.0, 3.0)]
        for spec, (want_y, want_dx) in cases:
            layer = layers.build(spec)
            layer.setup(CPU, dtype, np.random.default_rng(0))
            layer.build((x.shape[1],))
            for fast in (False, True):
                layer.buffers.enabled = fast
                y = layer.forward(x.copy())
                dx = layer.backward(dy.copy())
                assert y.dtype == dx.dtype == dtype, spec
                assert np.array_equal(y, want_y, equal_nan=True), (spec, fast)
                assert np.array_equal(dx, want_dx, equal_nan=True), (spec, fast)


def test_row_scatter_add_equals_add_at_on_rows():
    from dlrun.backend import CPU

    rng = np.random.default_rng(1)
    idx = rng.integers(0, 7, 300)  # many repeats
    v = rng.standard_normal((300, 5)).astype(np.float32)
    want = np.zeros((7, 5), np.float32)
    np.add.at(want, idx, v)
    got = np.zeros((7, 5), np.float32)
    CPU.scatter_add(got, idx, v)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_tanh_in_buffers_equals_the_formula_bit_for_bit(dtype):
    from dlrun.backend import CPU

    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(2000) * 4, [0.0, -0.0, 1e-30, -30.0, 30.0]]).astype(dtype).reshape(1, -1)
    dy = rng.standard_normal(x.shape).astype(dtype)
    c = 0.7978845608028654
    t = np.tanh(c * (x + 0.044715 * (x * x * x)))
    want_y = 0.5 * x * (1 + t)
    want_dx = dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * (c * (1 + (3 * 0.044715) * (x * x))))
    layer = layers.build({"type": "GELU", "approximate": "tanh"})
    layer.setup(CPU, dtype, np.random.default_rng(0))
    layer.build((x.shape[1],))
    for fast in (False, True, True):  # the second fast call reuses the buffers
        layer.buffers.enabled = fast
        y = layer.forward(x.copy())
        assert np.array_equal(y, want_y) and y.dtype == dtype
        dx = layer.backward(dy.copy())
        assert np.array_equal(dx, want_dx) and dx.dtype == dtype
