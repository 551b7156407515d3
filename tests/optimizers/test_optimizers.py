"""Optimizers: two hand-computed steps each (closed forms written out element by element with
Python floats), in-place updates without per-step allocation, float32 kept, state round trip."""
from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from dlrun import registry
from dlrun.layers.base import Parameter
from dlrun.optimizers import SGD, Adam, AdaGrad, AdamW, Optimizer, RMSProp

W0 = [1.0, -2.0, 0.5]
GRADS = [[0.5, 0.1, -4.0], [-0.3, 0.2, 1.0]]


def run_steps(opt: Optimizer, dtype=np.float64) -> np.ndarray:
    p = Parameter(np.array(W0, dtype=dtype), np.zeros(3, dtype=dtype))
    opt.setup([("w", p)])
    for g in GRADS:
        p.grad[...] = g  # as a backward pass writes it
        opt.step()
    return p.data


def by_element(update):
    """Apply a scalar reference update (state dict per element) over the two steps."""
    out = []
    for i, w in enumerate(W0):
        state: dict = {}
        for t, g in enumerate(GRADS, start=1):
            w = update(w, g[i], t, state)
        out.append(w)
    return np.array(out)


def ref_sgd(lr, mu=0.0, nesterov=False, wd=0.0):
    def update(w, g, t, s):
        g = g + wd * w
        if mu:
            s["v"] = mu * s.get("v", 0.0) + g
            g = g + mu * s["v"] if nesterov else s["v"]
        return w - lr * g
    return update


def ref_adam(lr, b1, b2, eps, wd=0.0, decoupled=False):
    def update(w, g, t, s):
        if decoupled:
            w = w * (1 - lr * wd)
        else:
            g = g + wd * w
        s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
        s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
        m_hat, v_hat = s["m"] / (1 - b1 ** t), s["v"] / (1 - b2 ** t)
        return w - lr * m_hat / (math.sqrt(v_hat) + eps)
    return update


def ref_rmsprop(lr, rho, eps, mu=0.0, wd=0.0):
    def update(w, g, t, s):
        g = g + wd * w
        s["v"] = rho * s.get("v", 0.0) + (1 - rho) * g * g
        step = g / (math.sqrt(s["v"]) + eps)
        if mu:
            s["b"] = mu * s.get("b", 0.0) + step
            step = s["b"]
        return w - lr * step
    return update


def ref_adagrad(lr, init, eps, wd=0.0):
    def update(w, g, t, s):
        g = g + wd * w
        s["s"] = s.get("s", init) + g * g
        return w - lr * g / (math.sqrt(s["s"]) + eps)
    return update


CASES = [
    ("sgd", lambda: SGD(0.1), ref_sgd(0.1)),
    ("sgd-momentum", lambda: SGD(0.1, momentum=0.9), ref_sgd(0.1, 0.9)),
    ("sgd-nesterov", lambda: SGD(0.1, momentum=0.9, nesterov=True), ref_sgd(0.1, 0.9, True)),
    ("sgd-weight-decay", lambda: SGD(0.1, momentum=0.5, weight_decay=0.01), ref_sgd(0.1, 0.5, False, 0.01)),
    ("sgd-plain-weight-decay", lambda: SGD(0.1, weight_decay=0.2), ref_sgd(0.1, 0.0, False, 0.2)),
    ("adam", lambda: Adam(0.01, 0.9, 0.999, 1e-8), ref_adam(0.01, 0.9, 0.999, 1e-8)),
    ("adam-weight-decay", lambda: Adam(0.01, 0.8, 0.99, 1e-3, weight_decay=0.1), ref_adam(0.01, 0.8, 0.99, 1e-3, 0.1)),
    ("adamw", lambda: AdamW(0.01, 0.9, 0.999, 1e-8, weight_decay=0.1), ref_adam(0.01, 0.9, 0.999, 1e-8, 0.1, True)),
    ("rmsprop", lambda: RMSProp(0.01, rho=0.9, epsilon=1e-8), ref_rmsprop(0.01, 0.9, 1e-8)),
    ("rmsprop-momentum-wd", lambda: RMSProp(0.01, 0.8, 1e-6, momentum=0.9, weight_decay=0.05),
     ref_rmsprop(0.01, 0.8, 1e-6, 0.9, 0.05)),
    ("adagrad", lambda: AdaGrad(0.1), ref_adagrad(0.1, 0.0, 1e-10)),
    ("adagrad-init-wd", lambda: AdaGrad(0.1, initial_accumulator_value=0.1, epsilon=1e-7, weight_decay=0.01),
     ref_adagrad(0.1, 0.1, 1e-7, 0.01)),
]


@pytest.mark.parametrize("make,ref", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_two_steps_match_hand_computation(make, ref):
    np.testing.assert_allclose(run_steps(make()), by_element(ref), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_takes_hyperparameters_changed_between_steps(dtype):
    """SGD keeps its hyperparameters as scalars of the tensors' type between steps; a learning rate,
    momentum or decay set between two steps (a schedule, a user) is the one the next step uses."""
    settings = [(0.1, 0.9, 0.01), (0.05, 0.9, 0.01), (0.05, 0.5, 0.02), (0.05, 0.5, 0.02), (0.2, 0.0, 0.02)]
    opt = SGD(*settings[0][:2], weight_decay=settings[0][2])  # (decay from the start: it needs a scratch buffer)
    p = Parameter(np.array(W0, dtype=dtype), np.zeros(3, dtype=dtype))
    opt.setup([("w", p)])
    w, v = np.array(W0, dtype=dtype), np.zeros(3, dtype=dtype)
    for t, (lr, mu, wd) in enumerate(settings):
        opt.learning_rate, opt.momentum, opt.weight_decay = lr, mu, wd
        g = np.array(GRADS[t % 2], dtype=dtype)
        p.grad[...] = g
        opt.step()
        g = g + dtype(wd) * w  # the update in the tensors' dtype, written out
        if mu:
            v = dtype(mu) * v + g
            w = w - dtype(lr) * v
        else:
            w = w - dtype(lr) * g
        np.testing.assert_array_equal(p.data, w, err_msg=f"step {t + 1}: lr={lr}, momentum={mu}, decay={wd}")


def test_sgd_first_steps_by_hand():
    # momentum 0.9, lr 0.1, w=1: g=0.5 -> v=0.5, w=0.95; g=-0.3 -> v=0.45-0.3=0.15, w=0.935
    w = run_steps(SGD(0.1, momentum=0.9))
    assert w[0] == pytest.approx(0.935, abs=1e-15)
    # Nesterov: step1 = 0.5 + 0.9*0.5 = 0.95 -> w=0.905; step2 = -0.3 + 0.9*0.15 = -0.165 -> 0.9215
    assert run_steps(SGD(0.1, momentum=0.9, nesterov=True))[0] == pytest.approx(0.9215, abs=1e-15)


def test_adam_first_step_is_lr_times_sign():
    # after one step m̂ = g and v̂ = g², so Δw = lr·g/(|g| + ε) ≈ lr·sign(g)
    p = Parameter(np.array(W0), np.array(GRADS[0]))
    opt = Adam(0.01)
    opt.setup([("w", p)])
    opt.step()
    np.testing.assert_allclose(p.data, np.array(W0) - 0.01 * np.sign(GRADS[0]), atol=1e-9)


def test_adamw_decay_is_decoupled_from_the_gradient_scale():
    # zero gradient: Adam's coupled decay moves by ≈ lr (normalised), AdamW shrinks by lr·λ·w
    for cls, expected in ((AdamW, 1.0 * (1 - 0.01 * 0.1)), (Adam, 1.0 - 0.01)):
        p = Parameter(np.array([1.0]), np.array([0.0]))
        opt = cls(0.01, weight_decay=0.1)
        opt.setup([("w", p)])
        opt.step()
        assert p.data[0] == pytest.approx(expected, rel=1e-6)


ALL = ["SGD", "Adam", "AdamW", "RMSProp", "AdaGrad"]
HEAVY = {"SGD": {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, "Adam": {"weight_decay": 0.01},
         "AdamW": {}, "RMSProp": {"momentum": 0.9, "weight_decay": 0.01}, "AdaGrad": {"weight_decay": 0.01}}


@pytest.mark.parametrize("name", ALL)
def test_every_registered_optimizer_has_a_hand_computed_case(name):
    assert set(registry.optimizers.names()) >= set(ALL)
    assert any(type(make()).__name__ == name for _, make, _ in CASES)


@pytest.mark.parametrize("name", ALL)
def test_step_is_in_place_float32_and_allocates_nothing_large(name):
    n = 250_000  # 1 MB of float32: any temporary the size of the parameter would show
    rng = np.random.default_rng(0)
    p = Parameter(rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32))
    opt = registry.optimizers.build({"type": name, **HEAVY[name]})
    opt.setup([("w", p)])
    data_id = id(p.data)
    p.grad[...] = rng.standard_normal(n)
    opt.step()  # first step may set things up lazily
    p.grad[...] = rng.standard_normal(n)
    tracemalloc.start()
    opt.step()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < n * 4 // 10, f"{name}.step allocated {peak} bytes"
    assert id(p.data) == data_id and p.data.dtype == np.float32
    assert all(a.dtype == np.float32 for s in opt.state.values() for a in s.values())
    assert np.isfinite(p.data).all()


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip_continues_identically(name):
    spec = {"type": name, **HEAVY[name]}
    a, b = registry.optimizers.build(spec), registry.optimizers.build(spec)
    pa = Parameter(np.array(W0), np.zeros(3))
    pb = Parameter(np.array(W0), np.zeros(3))
    a.setup([("w", pa)])
    b.setup([("w", pb)])
    pa.grad[...] = GRADS[0]
    a.step()
    pb.data[...] = pa.data
    b.load_state_dict({k: np.array(v) for k, v in a.state_dict().items()})
    assert not any(k.endswith("_work") for k in a.state_dict())
    for p in (pa, pb):
        p.grad[...] = GRADS[1]
    a.step()
    b.step()
    np.testing.assert_array_equal(pa.data, pb.data)


@pytest.mark.parametrize("make,ref", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matches_torch_when_available(make, ref):
    torch = pytest.importorskip("torch")
    opt = make()
    cls = {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW,
           "RMSProp": torch.optim.RMSprop, "AdaGrad": torch.optim.Adagrad}[type(opt).__name__]
    kw = {"lr": opt.learning_rate, "weight_decay": opt.weight_decay}
    if isinstance(opt, SGD):
        kw.update(momentum=opt.momentum, nesterov=opt.nesterov)
    elif isinstance(opt, Adam):
        kw.update(betas=(opt.beta1, opt.beta2), eps=opt.epsilon)
    elif isinstance(opt, RMSProp):
        kw.update(alpha=opt.rho, eps=opt.epsilon, momentum=opt.momentum)
    else:
        kw.update(initial_accumulator_value=opt.initial_accumulator_value, eps=opt.epsilon)
    w = torch.tensor(W0, dtype=torch.float64, requires_grad=True)
    t_opt = cls([w], **kw)
    for g in GRADS:
        w.grad = torch.tensor(g, dtype=torch.float64)
        t_opt.step()
    np.testing.assert_allclose(run_steps(make()), w.detach().numpy(), rtol=1e-12, atol=1e-14)
