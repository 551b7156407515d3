"""MultiHeadAttention against PyTorch's nn.MultiheadAttention on copied weights (outputs and every
gradient, float64, skipped without torch), dropout on the attention weights, the causal mask;
PositionalEmbedding, SequencePool, Linear's position_wise option and LayerNorm over each step;
numeric gradient checks of each; the lookup generator, and the shipped transformer against a
bag of embeddings on it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU
from dlrun.config import config_from_dict
from dlrun.errors import ConfigError
from dlrun.gradcheck import PASS, check_layer
from dlrun.runs.assembly import assemble

RTOL, ATOL = 1e-10, 1e-12


def _layer(name, x_shape, seed=1, **options):
    layer = registry.layers.build({"type": name, **options})
    layer.setup(CPU, np.float64, np.random.default_rng(seed), CPU.rng(0))
    out_shape = layer.build(x_shape)
    return layer, out_shape


def _mha(t, e, seed=1, **options):
    """A float64 MultiHeadAttention with non-zero biases (zeros would hide a wrong bias gradient)."""
    layer, out_shape = _layer("MultiHeadAttention", (t, e), seed, bias_initializer={"type": "normal", "std": 0.3},
                              **options)
    assert out_shape == (t, e)
    return layer


def _torch_mha(torch, layer, e, heads, bias=True):
    ref = torch.nn.MultiheadAttention(e, heads, bias=bias, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.from_numpy(layer.in_weight.data))
        ref.out_proj.weight.copy_(torch.from_numpy(layer.out_weight.data))
        if bias:
            ref.in_proj_bias.copy_(torch.from_numpy(layer.in_bias.data))
            ref.out_proj.bias.copy_(torch.from_numpy(layer.out_bias.data))
    return ref


def _future(torch, t):
    """PyTorch's boolean attn_mask: True where attending is not allowed (s > t)."""
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


def _run(layer, x, dy):
    out = layer.forward(x)
    dx = layer.backward(dy)
    return out.copy(), dx.copy(), {k: p.grad.copy() for k, p in layer.params.items()}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [1, 2, 3, 4, 6])
def test_outputs_and_every_gradient_equal_pytorch(heads, causal):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(heads)
    n, t, e = 4, 5, 12
    layer = _mha(t, e, heads=heads, causal=causal)
    x = rng.standard_normal((n, t, e))
    dy = rng.standard_normal((n, t, e))
    out, dx, grads = _run(layer, x, dy)

    ref = _torch_mha(torch, layer, e, heads)
    xt = torch.from_numpy(x).requires_grad_()
    want, _ = ref(xt, xt, xt, attn_mask=_future(torch, t) if causal else None, need_weights=False)
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["in_weight"], ref.in_proj_weight.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["in_bias"], ref.in_proj_bias.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["out_weight"], ref.out_proj.weight.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["out_bias"], ref.out_proj.bias.grad.numpy(), rtol=RTOL, atol=ATOL)
    # the key bias shifts each row of scores by a constant: its gradient is 0 (PyTorch's is rounding noise)
    assert not grads["in_bias"][e:2 * e].any() and np.abs(ref.in_proj_bias.grad.numpy()[e:2 * e]).max() < 1e-12


def test_without_bias_equals_pytorch_without_bias():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    n, t, e, heads = 3, 6, 8, 2
    layer = _mha(t, e, heads=heads, use_bias=False)
    assert set(layer.params) == {"in_weight", "out_weight"}
    x, dy = rng.standard_normal((n, t, e)), rng.standard_normal((n, t, e))
    out, dx, grads = _run(layer, x, dy)
    ref = _torch_mha(torch, layer, e, heads, bias=False)
    xt = torch.from_numpy(x).requires_grad_()
    want, _ = ref(xt, xt, xt, need_weights=False)
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["in_weight"], ref.in_proj_weight.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["out_weight"], ref.out_proj.weight.grad.numpy(), rtol=RTOL, atol=ATOL)


def _reference(torch, layer, x, heads, d, causal, weight_mask=None):
    """Attention written out in torch (autograd differentiates it), with an optional fixed
    multiplier of the attention weights (the layer's dropout mask)."""
    n, t, e = x.shape
    p = {k: torch.from_numpy(v.data.copy()).requires_grad_() for k, v in layer.params.items()}
    qkv = x @ p["in_weight"].T + p["in_bias"]
    q, k, v = (z.reshape(n, t, heads, d).transpose(1, 2) for z in qkv.split(heads * d, dim=-1))
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(_future(torch, t), -math.inf)
    a = torch.softmax(s, dim=-1)
    if weight_mask is not None:
        a = a * torch.from_numpy(weight_mask)
    o = (a @ v).transpose(1, 2).reshape(n, t, heads * d)
    return o @ p["out_weight"].T + p["out_bias"], p


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_key_dim_other_than_embedding_over_heads_equals_the_written_out_attention(causal):
    """h·d ≠ E (Keras' key_dim): nn.MultiheadAttention cannot express it, so the oracle is the
    formula in torch."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    n, t, e, heads, d = 3, 4, 5, 3, 2
    layer = _mha(t, e, heads=heads, key_dim=d, causal=causal)
    assert layer.in_weight.shape == (3 * heads * d, e) and layer.out_weight.shape == (e, heads * d)
    x, dy = rng.standard_normal((n, t, e)), rng.standard_normal((n, t, e))
    out, dx, grads = _run(layer, x, dy)
    xt = torch.from_numpy(x).requires_grad_()
    want, p = _reference(torch, layer, xt, heads, d, causal)
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    for k in grads:
        np.testing.assert_allclose(grads[k], p[k].grad.numpy(), rtol=RTOL, atol=ATOL, err_msg=k)


def test_large_scores_stay_finite_and_equal_pytorch():
    """The softmax subtracts each row's maximum: scores in the thousands neither overflow nor NaN."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    n, t, e, heads = 2, 5, 4, 2
    layer = _mha(t, e, heads=heads)
    layer.in_weight.data *= 30.0
    x, dy = 30.0 * rng.standard_normal((n, t, e)), rng.standard_normal((n, t, e))
    out, dx, _ = _run(layer, x, dy)
    assert np.isfinite(out).all() and np.isfinite(dx).all()
    assert np.abs(layer._cache[4] - 1).min() < 1e-12  # weights saturated at 1: the case a naive exp overflows
    ref = _torch_mha(torch, layer, e, heads)
    xt = torch.from_numpy(x).requires_grad_()
    want, _ = ref(xt, xt, xt, need_weights=False)
    want.backward(torch.from_numpy(dy))
    # relative to the whole array: at scores in the thousands an element of dx is a difference of
    # terms some 1e4 times larger, so its own relative error depends on the machine's exp and BLAS
    for got, ref, what in ((out, want.detach().numpy(), "output"), (dx, xt.grad.numpy(), "input gradient")):
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 1e-11, f"{what}: relative error {err:.2e} against torch"


def test_causal_output_at_a_step_ignores_every_later_step():
    rng = np.random.default_rng(2)
    n, t, e = 3, 6, 4
    layer = _mha(t, e, heads=2, causal=True)
    x = rng.standard_normal((n, t, e))
    out = layer.forward(x).copy()
    for step in range(t - 1):
        later = x.copy()
        later[:, step + 1:] = rng.standard_normal(later[:, step + 1:].shape)
        changed = layer.forward(later)
        np.testing.assert_array_equal(changed[:, :step + 1], out[:, :step + 1])
        assert not np.allclose(changed[:, step + 1:], out[:, step + 1:])
    weights = layer._cache[4]
    assert (weights[..., np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] == 0).all()


def test_dropout_drops_attention_weights_in_training_only_and_by_its_seed():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    n, t, e, heads, rate = 64, 8, 6, 3, 0.3
    layer = _mha(t, e, heads=heads, dropout=rate)
    plain = _mha(t, e, heads=heads)  # the same seed draws the same weights
    x, dy = rng.standard_normal((n, t, e)), rng.standard_normal((n, t, e))

    layer.training = plain.training = False  # evaluation: every weight, no scaling
    np.testing.assert_array_equal(layer.forward(x), plain.forward(x))
    assert layer._cache[5] is None

    layer.training = True
    layer.seed_rng(11)
    out, dx, grads = _run(layer, x, dy)
    mask = layer._cache[5].copy()  # the weights' multiplier: 0 or 1/(1 − rate)
    assert mask.shape == (n, heads, t, t)
    assert set(np.unique(mask)) == {0.0, 1.0 / (1.0 - rate)}
    assert abs((mask == 0).mean() - rate) < 0.02  # 12,288 draws
    assert not np.allclose(out, plain.forward(x))

    xt = torch.from_numpy(x).requires_grad_()
    want, p = _reference(torch, layer, xt, heads, e // heads, False, weight_mask=mask)
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    for k in grads:
        np.testing.assert_allclose(grads[k], p[k].grad.numpy(), rtol=RTOL, atol=ATOL, err_msg=k)

    layer.seed_rng(11)  # the same seed drops the same weights
    np.testing.assert_array_equal(layer.forward(x), out)
    layer.seed_rng(12)
    assert not np.array_equal(layer.forward(x), out)


@pytest.mark.parametrize("options", [{"heads": 1}, {"heads": 3, "key_dim": 2}, {"heads": 2, "causal": True},
                                     {"heads": 2, "dropout": 0.5}, {"heads": 2, "key_dim": 3, "use_bias": False}],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_numeric_gradient_check_passes(options, dtype):
    from dlrun.gradcheck import Settings

    report = check_layer("MultiHeadAttention", options, Settings(dtype=dtype))
    assert report.verdict == PASS, [(r.name, r.worst, r.notes) for r in report.tensors]


@pytest.mark.parametrize("name,options,shape", [
    ("PositionalEmbedding", {}, (5, 3)),
    ("SequencePool", {"mode": "mean"}, (5, 3)),
    ("SequencePool", {"mode": "first"}, (4, 2, 3)),
    ("SequencePool", {"mode": "last"}, (5, 3)),
    ("Linear", {"units": 4, "position_wise": True}, (5, 3)),
    ("Linear", {"units": 2, "position_wise": True}, (2, 4, 3)),
    ("Linear", {"units": 4, "position_wise": True, "use_bias": False}, (3,)),
])
def test_sequence_layers_pass_a_numeric_gradient_check(name, options, shape):
    report = check_layer(name, options, input_shape=shape)
    assert report.verdict == PASS, [(r.name, r.worst, r.notes) for r in report.tensors]


def test_positional_embedding_adds_one_learned_row_per_step():
    rng = np.random.default_rng(0)
    layer, out_shape = _layer("PositionalEmbedding", (4, 3))
    assert out_shape == (4, 3) and layer.weight.shape == (4, 3)
    x, dy = rng.standard_normal((5, 4, 3)), rng.standard_normal((5, 4, 3))
    np.testing.assert_array_equal(layer.forward(x), x + layer.weight.data[None])
    np.testing.assert_array_equal(layer.backward(dy), dy)
    np.testing.assert_allclose(layer.weight.grad, dy.sum(axis=0), rtol=1e-15)


@pytest.mark.parametrize("mode,pick", [("mean", lambda x: x.mean(axis=1)), ("first", lambda x: x[:, 0]),
                                       ("last", lambda x: x[:, -1])])
def test_sequence_pool_modes(mode, pick):
    rng = np.random.default_rng(0)
    layer, out_shape = _layer("SequencePool", (4, 3), mode=mode)
    assert out_shape == (3,)
    x, dy = rng.standard_normal((5, 4, 3)), rng.standard_normal((5, 3))
    np.testing.assert_allclose(layer.forward(x), pick(x), rtol=1e-15)
    dx = layer.backward(dy)
    want = {"mean": np.repeat(dy[:, None] / 4, 4, axis=1),
            "first": np.concatenate([dy[:, None], np.zeros((5, 3, 3))], axis=1),
            "last": np.concatenate([np.zeros((5, 3, 3)), dy[:, None]], axis=1)}[mode]
    np.testing.assert_allclose(dx, want, rtol=1e-15)


def test_position_wise_linear_is_the_plain_linear_at_every_step():
    rng = np.random.default_rng(0)
    steps, _ = _layer("Linear", (4, 3), units=5, position_wise=True, bias_initializer={"type": "normal", "std": 1})
    plain, _ = _layer("Linear", (3,), units=5, bias_initializer={"type": "normal", "std": 1})
    np.testing.assert_array_equal(steps.weight.data, plain.weight.data)
    x, dy = rng.standard_normal((6, 4, 3)), rng.standard_normal((6, 4, 5))
    out, dx = steps.forward(x), steps.backward(dy)
    assert out.shape == (6, 4, 5) and dx.shape == x.shape
    np.testing.assert_allclose(out, plain.forward(x.reshape(24, 3)).reshape(6, 4, 5), rtol=1e-14)
    np.testing.assert_allclose(dx, plain.backward(dy.reshape(24, 5)).reshape(6, 4, 3), rtol=1e-14)
    np.testing.assert_allclose(steps.weight.grad, plain.weight.grad, rtol=1e-14)
    np.testing.assert_allclose(steps.bias.grad, plain.bias.grad, rtol=1e-14)


def test_layernorm_normalises_each_step_of_a_sequence_as_pytorch():
    """LayerNorm's default axes: 1 on (N, T, E) is PyTorch's LayerNorm(E): each step on its own."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    layer, out_shape = _layer("LayerNorm", (4, 6))
    assert out_shape == (4, 6) and layer.gamma.shape == (6,)
    layer.gamma.data[...] = rng.standard_normal(6)
    layer.beta.data[...] = rng.standard_normal(6)
    x, dy = rng.standard_normal((3, 4, 6)), rng.standard_normal((3, 4, 6))
    out, dx, grads = _run(layer, x, dy)
    xt = torch.from_numpy(x).requires_grad_()
    g, b = (torch.from_numpy(layer.params[k].data.copy()).requires_grad_() for k in ("gamma", "beta"))
    want = torch.nn.functional.layer_norm(xt, (6,), g, b, eps=1e-5)
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["gamma"], g.grad.numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads["beta"], b.grad.numpy(), rtol=RTOL, atol=ATOL)
    assert check_layer("LayerNorm", {}, input_shape=(4, 6)).verdict == PASS


def _model_error(model, data=None):
    raw = {"seed": 0, "data": data or {"type": "lookup", "samples": 40, "length": 5, "vocabulary": 6},
           "model": model, "loss": "SoftmaxCrossEntropy", "optimizer": "Adam"}
    with pytest.raises(ConfigError) as e:
        assemble(config_from_dict(raw))
    return str(e.value)


def test_shape_errors_name_the_layer_and_what_it_needs():
    emb = {"type": "Embedding", "input_dim": 6, "output_dim": 10}
    assert ("model[1]: MultiHeadAttention(heads=4) splits the embedding size E=10 among its heads, but 10 is not a "
            "multiple of 4; change heads or give key_dim") in _model_error([emb, {"type": "MultiHeadAttention",
                                                                               "heads": 4}])
    assert "model[2]: MultiHeadAttention expects (N, T, E) input" in _model_error(
        [emb, {"type": "SequencePool"}, {"type": "MultiHeadAttention"}])
    assert ("model[1]: Linear expects (N, features) input; add a Flatten before it, or set position_wise: true to "
            "apply it to each step, got input of shape (5, 10) per sample") in _model_error(
        [emb, {"type": "Linear", "units": 3}])
    assert "model[0]: PositionalEmbedding expects (N, T, E) input" in _model_error([{"type": "PositionalEmbedding"}])
    assert "model[0]: SequencePool expects (N, T, features) input" in _model_error([{"type": "SequencePool"}])


def test_lookup_labels_are_the_token_the_first_token_points_at():
    ds = registry.data.build({"type": "lookup", "samples": 500, "length": 6, "vocabulary": 4, "seed": 3})
    x, y = ds.x, ds.y
    assert x.shape == (500, 6) and x.dtype == np.float64 and y.shape == (500,) and y.dtype == np.int64
    p = x[:, 0].astype(int)
    assert p.min() == 1 and p.max() == 5
    np.testing.assert_array_equal(y, x[np.arange(500), p])
    assert set(np.unique(x[:, 1:])) == {0, 1, 2, 3} and set(np.unique(y)) == {0, 1, 2, 3}
    again = registry.data.build({"type": "lookup", "samples": 500, "length": 6, "vocabulary": 4, "seed": 3})
    np.testing.assert_array_equal(again.x, x)
    other = registry.data.build({"type": "lookup", "samples": 500, "length": 6, "vocabulary": 4, "seed": 4})
    assert not np.array_equal(other.x, x)


def _final(r, key):
    """The last epoch's ``key`` from the summary.json of the run directory ``r`` printed."""
    run_dir = Path(r.out.strip().splitlines()[-1])
    return json.loads((run_dir / "summary.json").read_text())[key]


@pytest.mark.slow
def test_the_shipped_transformer_learns_the_lookup_task_and_a_bag_of_embeddings_does_not(tmp_path):
    """The same data: the label is the token at the position the first token names. Attention
    with learned positions finds it; averaging the embeddings first loses where tokens stand."""
    from conftest import CONFIGS, run_cli

    r = run_cli("train", CONFIGS / "transformer.yaml", "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    assert _final(r, "val_accuracy") >= 0.95, r.out  # seed 0: 1.000
    r = run_cli("train", CONFIGS / "bag_of_embeddings.yaml", "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    assert _final(r, "val_accuracy") < 0.5, r.out  # seed 0: 0.30; chance is 0.1
