"""The flat parameter buffer (dlrun.backend.arena) and the one-pass optimizer update over it.

Oracles: the same optimizer run parameter by parameter (no arena), exact values given to
add_param, and the non-finite guard's documented restore point.
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.errors import NonFiniteError
from dlrun.layers.base import Layer
from dlrun.model import Sequential
from dlrun.optimizers.base import Optimizer
from dlrun.training.trainer import Trainer


class Fixed(Layer):
    """y = x·w + c with a known trainable w (odd size, so padding follows it) and a constant c."""

    def build(self, input_shape):
        (d,) = input_shape
        self.w = self.add_param("w", (d,), value=np.arange(1, d + 1) / 10)
        self.c = self.add_param("c", (d,), value=np.full(d, 0.25), trainable=False)
        return input_shape

    def forward(self, x, y=None):
        self._x = x
        return x * self.w.data + self.c.data

    def backward(self, dy):
        self.w.grad[...] = (dy * self._x).sum(axis=0)
        return dy * self.w.data


def model(seed=0, first=None):
    specs = [{"type": "Linear", "units": 5}, "ReLU", {"type": "Linear", "units": 3}]
    layers = ([first] if first is not None else []) + [registry.layers.build(s) for s in specs]
    return Sequential(layers, (3,), seed=seed)


def test_trainable_tensors_are_aligned_views_of_one_buffer_and_keep_their_values():
    m = model(first=Fixed())
    arena = m.arena
    trainable = [p for _, p in m.named_parameters() if p.trainable]
    assert arena.holds(trainable) and len(arena) == 5  # w, two weights, two biases; not the constant
    constant = m.layers[0].c
    assert not np.shares_memory(constant.data, arena.data) and constant.grad is None
    np.testing.assert_array_equal(constant.data, np.full(3, 0.25, np.float32))
    np.testing.assert_array_equal(m.layers[0].w.data, (np.arange(1, 4) / 10).astype(np.float32))
    for p, off in zip(arena.params, arena.offsets):
        assert off % 16 == 0  # 64-byte boundaries for float32
        assert np.shares_memory(p.data, arena.data) and np.shares_memory(p.grad, arena.grad)
        assert p.data.flags.c_contiguous and p.data.dtype == np.float32
        assert p.data.__array_interface__["data"][0] == arena.data[off:].__array_interface__["data"][0]
    pad = _padding(arena)
    assert pad.any() and not arena.data[pad].any() and not arena.grad[pad].any()  # the padding is zero


SPECS = [{"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
         {"type": "SGD", "learning_rate": 0.1},
         {"type": "Adam", "weight_decay": 0.01}, {"type": "AdamW"},
         {"type": "RMSProp", "momentum": 0.5}, {"type": "AdaGrad", "initial_accumulator_value": 0.1}]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["type"])
def test_one_pass_update_equals_the_update_parameter_by_parameter(spec):
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 3)).astype(np.float32), rng.integers(0, 3, 8)
    flat_model, each_model = model(first=Fixed()), model(first=Fixed())
    flat_opt, each_opt = registry.optimizers.build(spec), registry.optimizers.build(spec)
    flat_opt.setup(flat_model.named_parameters(), arena=flat_model.arena)
    each_opt.setup(each_model.named_parameters())  # no arena: one _update per parameter
    assert len(flat_opt.buffers()) == len(flat_opt.slots)  # one flat array per slot
    assert len(each_opt.buffers()) == 5 * len(flat_opt.slots)
    loss = registry.losses.build("SoftmaxCrossEntropy")
    for _ in range(4):
        for m, opt in ((flat_model, flat_opt), (each_model, each_opt)):
            loss.forward(m.forward(x), y)
            m.backward(loss.backward())
            opt.step()
    for (name, a), (_, b) in zip(flat_model.named_parameters(), each_model.named_parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)
    for key, value in each_opt.state_dict().items():  # the per-parameter views hold the same state
        np.testing.assert_array_equal(flat_opt.state_dict()[key], value, err_msg=key)
    assert not flat_model.arena.data[_padding(flat_model.arena)].any()  # updates leave the padding at zero


def _padding(arena):
    """Mask of the flat entries that belong to no tensor."""
    pad = np.ones(arena.size, bool)
    for p, off in zip(arena.params, arena.offsets):
        pad[off:off + p.size] = False
    return pad


class Rebinding(Optimizer):
    """A user's optimizer that replaces param.data instead of writing into it."""

    def __init__(self, learning_rate: float = 0.1):
        super().__init__(learning_rate)

    def _update(self, state, p):
        p.data = p.data - self.learning_rate * p.grad


def test_an_optimizer_that_rebinds_data_trains_and_the_arena_takes_the_values_back():
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((30, 3)).astype(np.float32), rng.integers(0, 3, 30)
    m = model()
    trainer = Trainer(m, registry.losses.build("SoftmaxCrossEntropy"), Rebinding(0.5), batch_size=10, seed=0)
    hist = trainer.fit(x, y, epochs=15)
    assert hist.rows[-1]["train_loss"] < 0.9 * hist.rows[0]["train_loss"]
    for _, p in m.named_parameters():  # the guard's end-of-epoch check brought every array back
        assert np.shares_memory(p.data, m.arena.data)
    saved = {k: v.copy() for k, v in m.state_arrays().items()}
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(hist.rows[-1]["train_loss"], rel=0.2)
    trainer.optimizer.learning_rate = 1e30  # blows up within the next epoch
    with pytest.raises(NonFiniteError), np.errstate(over="ignore", invalid="ignore"):
        trainer.fit(x, y, epochs=16)
    for name, value in m.state_arrays().items():  # restored into the live arrays, not a stale copy
        np.testing.assert_array_equal(value, saved[name], err_msg=name)


def test_rebinding_a_tensor_flags_the_arena_and_adopt_copies_it_back():
    m = model()
    arena, weight = m.arena, m.layers[0].weight
    view = weight.data
    assert not arena.dirty  # building the model leaves nothing to adopt
    view[0, 0] = 6.0  # writing into the view is not a rebinding
    weight.data += 1.0  # nor is an augmented assignment, which assigns the same array back
    assert not arena.dirty and weight.data is view and view[0, 0] == 7.0
    weight.grad = np.full(weight.shape, 2.0, np.float32)  # a layer that returns a new gradient array
    weight.data = weight.data + 1.0
    assert arena.dirty
    arena.adopt()
    assert not arena.dirty and weight.data is view
    assert np.shares_memory(weight.grad, arena.grad) and (arena.view(arena.grad, weight) == 2.0).all()
    assert arena.view(arena.data, weight)[0, 0] == 8.0


class LazyState:
    """A user's optimizer written without the base class that creates its state on the first step."""

    def __init__(self):
        self.learning_rate, self.iterations, self.slots, self.state = 0.1, 0, ("velocity",), {}

    def setup(self, named_params):
        self.params = [(n, p) for n, p in named_params if p.trainable]

    def step(self):
        self.iterations += 1
        for name, p in self.params:
            v = self.state.setdefault(name, {"velocity": np.zeros_like(p.data)})["velocity"]
            v *= 0.9
            v += p.grad
            p.data -= self.learning_rate * v


def test_the_guard_snapshots_optimizer_state_created_after_the_first_epoch():
    from dlrun.training.faults import NonFiniteGuard

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((12, 3)).astype(np.float32), rng.integers(0, 3, 12)
    trainer = Trainer(model(), registry.losses.build("SoftmaxCrossEntropy"), LazyState(), batch_size=12, seed=0)
    guard = NonFiniteGuard(trainer)
    guard.mark()  # no state yet
    trainer.train_step(x, y)
    guard.mark()  # now one velocity per tensor
    saved = {n: s["velocity"].copy() for n, s in trainer.optimizer.state.items()}
    assert len(guard.optim) == len(saved) == 4
    trainer.train_step(x, y)
    guard.restore()
    for name, slots in trainer.optimizer.state.items():
        np.testing.assert_array_equal(slots["velocity"], saved[name], err_msg=name)


class RebindingState(LazyState):
    """A plugin optimizer that replaces its state arrays every step instead of writing into them."""

    def step(self):
        self.iterations += 1
        for name, p in self.params:
            old = self.state.get(name, {}).get("velocity", np.zeros_like(p.data))
            self.state[name] = {"velocity": old * 0.9 + p.grad}
            p.data -= self.learning_rate * self.state[name]["velocity"]


def test_the_guard_snapshots_the_optimizer_state_arrays_that_are_current_at_each_mark():
    from dlrun.training.faults import NonFiniteGuard

    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((12, 3)).astype(np.float32), rng.integers(0, 3, 12)
    trainer = Trainer(model(), registry.losses.build("SoftmaxCrossEntropy"), RebindingState(), batch_size=12, seed=0)
    guard = NonFiniteGuard(trainer)
    trainer.train_step(x, y)
    guard.mark()
    trainer.train_step(x, y)  # new velocity arrays, as many as before
    guard.mark()  # must copy these, not the arrays of the first mark
    saved = {n: s["velocity"].copy() for n, s in trainer.optimizer.state.items()}
    weights = [p.data.copy() for _, p in trainer.model.named_parameters()]
    trainer.train_step(x, y)
    guard.restore()
    for name, slots in trainer.optimizer.state.items():
        np.testing.assert_array_equal(slots["velocity"], saved[name], err_msg=name)
    for (name, p), w in zip(trainer.model.named_parameters(), weights):
        np.testing.assert_array_equal(p.data, w, err_msg=name)
