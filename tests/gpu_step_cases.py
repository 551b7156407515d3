"""The training steps that the GPU tests queue, shared by tests/backend/test_gpu.py (on a device)
and tests/backend/test_gpu_step_host_reads.py and tests/training/test_cuda_graph.py (on the CPU
stand-in for CuPy); :func:`train_steps` trains a case with or without its CUDA graph.

Between them the cases hold every model part the step has a GPU branch for, and every
registered loss, optimizer, regularizer and ``train.metrics`` metric, with gradient clipping:
``covered`` says which, and a test fails when a newly registered component has no case.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlrun import metrics, registry
from dlrun.backend import to_host
from dlrun.model import Sequential
from dlrun.training.controls import GradientClipping
from dlrun.training.trainer import Trainer

MLP = [{"type": "Linear", "units": 8}, "Tanh", {"type": "Linear", "units": 3}]
SGD = {"type": "SGD", "learning_rate": 0.1}


@dataclass(frozen=True)
class StepCase:
    layers: list
    in_shape: tuple = (4,)
    optimizer: dict = field(default_factory=lambda: dict(SGD))
    loss: str | dict = "SoftmaxCrossEntropy"
    regularizer: dict | None = None
    metrics: tuple = ()
    clip: bool = False  # GradientClipping(clip_norm=1.0, clip_value=5.0) after backward
    classes: int = 3  # the model's outputs; labels are classes, or real targets for a regression loss

    def build(self, backend, dtype=np.float32):
        """(the trainer, the callbacks its step gets) on ``backend``."""
        model = Sequential([registry.layers.build(s) for s in self.layers], self.in_shape, backend, dtype, seed=0)
        loss = registry.losses.build(self.loss)
        reg = registry.regularizers.build(self.regularizer) if self.regularizer else None
        chosen = metrics.build(list(self.metrics), loss, self.classes)
        trainer = Trainer(model, loss, registry.optimizers.build(self.optimizer), reg, batch_size=16,
                          metrics=chosen)
        callbacks = [GradientClipping(clip_norm=1.0, clip_value=5.0)] if self.clip else []
        for cb in callbacks:
            cb.on_train_begin(trainer)
        return trainer, callbacks

    def batch(self, rng, dtype=np.float32):
        """A host batch of 16: inputs, and labels (or targets) the loss takes."""
        first = self.layers[0]
        if isinstance(first, dict) and first["type"] == "Embedding":  # indices, carried as floats
            x = rng.integers(0, first["input_dim"], (16,) + self.in_shape).astype(dtype)
        else:
            x = rng.standard_normal((16,) + self.in_shape).astype(dtype)
        task = getattr(registry.losses.build(self.loss), "task", "classification")
        if task == "regression":
            return x, rng.standard_normal((16, self.classes)).astype(dtype)
        return x, rng.integers(0, max(self.classes, 2), 16)


def _out(units):
    return MLP[:-1] + [{"type": "Linear", "units": units}]


STEP_CASES = {
    # (no bias before BatchNorm, as in practice: BatchNorm takes out the batch mean, so that bias's
    # gradient is zero but for rounding, and Adam, which divides by the gradient's size, would
    # turn the rounding of two equal ways of summing into steps of the learning rate)
    "mlp+batchnorm+dropout, Adam, L2, clip_norm": StepCase(
        [{"type": "Linear", "units": 32, "use_bias": False}, {"type": "BatchNorm"}, "ReLU", {"type": "Dropout", "rate": 0.2},
         {"type": "Linear", "units": 3}], optimizer={"type": "Adam", "learning_rate": 0.01},
        regularizer={"type": "L2", "strength": 1e-3}, metrics=("f1", {"type": "top_k_accuracy", "k": 2}), clip=True),
    "cnn, SGD momentum": StepCase(
        [{"type": "Conv2D", "filters": 4, "kernel_size": 3}, "ReLU", {"type": "MaxPool2D", "pool_size": 2},
         "Flatten", {"type": "Linear", "units": 3}], (1, 8, 8), {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9}),
    "LargeMarginFC (labels in forward), RMSProp": StepCase(
        [{"type": "Linear", "units": 8}, "Tanh", {"type": "LargeMarginFC", "units": 3, "k": 0.5}],
        optimizer={"type": "RMSProp", "learning_rate": 0.01}),
    "Embedding (indices), GELU, SGD": StepCase(
        [{"type": "Embedding", "input_dim": 10, "output_dim": 4}, "Flatten", "GELU", {"type": "Linear", "units": 3}],
        (5,)),
    "transformer pieces (attention: causal, dropout; positions, position-wise Linear, pooling), Adam": StepCase(
        [{"type": "Embedding", "input_dim": 10, "output_dim": 8}, "PositionalEmbedding", "LayerNorm",
         {"type": "MultiHeadAttention", "heads": 2, "causal": True, "dropout": 0.1},
         {"type": "Linear", "units": 8, "position_wise": True}, "ReLU", {"type": "SequencePool", "mode": "last"},
         {"type": "Linear", "units": 3}], (5,), {"type": "Adam", "learning_rate": 0.01}),
    "recurrent (LSTM, GRU, SimpleRNN: the sequence kernels), Adam": StepCase(
        [{"type": "LSTM", "units": 8, "return_sequences": True}, {"type": "GRU", "units": 6, "return_sequences": True},
         {"type": "SimpleRNN", "units": 5}, {"type": "Linear", "units": 3}], (5, 3),
        {"type": "Adam", "learning_rate": 0.01}),
    # every loss
    "BinaryCrossEntropy, precision/recall/f1": StepCase(_out(1), loss="BinaryCrossEntropy", classes=1,
                                                       metrics=("precision", "recall", "f1")),
    "Hinge": StepCase(MLP, loss="Hinge"),
    "NLL": StepCase(MLP + ["LogSoftmax"], loss="NLL"),
    "SoftmaxCrossEntropy smoothed, weighted": StepCase(
        MLP, loss={"type": "SoftmaxCrossEntropy", "label_smoothing": 0.1, "class_weights": [1.0, 2.0, 0.5]}),
    "MSE, regression metrics": StepCase(_out(2), loss="MSE", classes=2, metrics=("mae", "mse", "rmse", "r2")),
    "Huber": StepCase(_out(2), loss="Huber", classes=2, metrics=("r2",)),
    # every optimizer (and its GPU variants)
    "SGD nesterov, clip_value": StepCase(MLP, optimizer={"type": "SGD", "learning_rate": 0.1, "momentum": 0.9,
                                                         "nesterov": True}, clip=True),
    "AdaGrad, L1": StepCase(MLP, optimizer={"type": "AdaGrad", "learning_rate": 0.1},
                            regularizer={"type": "L1", "strength": 1e-3}),
    "AdamW": StepCase(MLP, optimizer={"type": "AdamW", "learning_rate": 0.01}),
    "RMSProp momentum": StepCase(MLP, optimizer={"type": "RMSProp", "learning_rate": 0.01, "momentum": 0.9}),
    # every classification metric, with its options
    "accuracy metrics": StepCase(MLP, metrics=(
        {"type": "precision", "average": "macro"}, {"type": "recall", "average": "weighted"},
        {"type": "top_k_accuracy", "k": 2})),
}


def covered() -> dict[str, set]:
    """The registered names each kind's cases use."""
    def name(spec):
        return spec if isinstance(spec, str) else spec["type"]

    seen = {"losses": set(), "optimizers": set(), "regularizers": set(), "metrics": set()}
    for c in STEP_CASES.values():
        seen["losses"].add(name(c.loss))
        seen["optimizers"].add(name(c.optimizer))
        if c.regularizer:
            seen["regularizers"].add(name(c.regularizer))
        seen["metrics"] |= {name(m) for m in c.metrics}
        if getattr(registry.losses.build(c.loss), "task", "classification") == "classification":
            seen["metrics"].add("accuracy")  # every classification step counts the correct predictions
    return seen


STEPS = 7  # train_steps: the first (checked) step, WARMUP ordinary ones, the capture and replays; then a short batch


def train_steps(case, gpu, graph=True, steps=STEPS, middle=None):
    """``steps`` steps of a case with a learning rate that changes every step (as a per-step
    schedule sets it), then one smaller batch; everything the steps leave behind. ``middle(trainer)``
    is called after half the steps."""
    c = STEP_CASES[case]
    trainer, callbacks = c.build(gpu)
    step = trainer.training_step
    if not graph:
        step.graph = None
    sums = trainer.tracker.zeros()
    rng = np.random.default_rng(0)
    trainer.fast_mode(True)
    scores = []
    for k in range(steps + 1):
        if middle is not None and k == steps // 2:
            middle(trainer)
        trainer.optimizer.learning_rate *= 0.8
        x, y = c.batch(rng)
        if k == steps:
            x, y = x[:11], y[:11]  # an epoch's last, smaller batch: the ordinary step
        total, correct = step(gpu.asarray(x), gpu.asarray(y), callbacks, sums=sums)
        scores.append((to_host(total), to_host(correct)))
    trainer.fast_mode(False)
    weights = {n: to_host(a) for n, a in trainer.model.state_arrays().items()}
    state = {n: to_host(a) for n, a in trainer.optimizer.state_dict().items()}
    return trainer, weights, state, scores, None if sums is None else to_host(sums)


def evaluate_batches(case, gpu, graph=True, batches=STEPS, middle=None):
    """``batches`` evaluation batches of a case (after one training step, so that BatchNorm's
    running statistics are not the initial ones), then one smaller batch, as an epoch's
    validation runs them: each batch's score and the metric sums. ``middle(trainer)`` is called
    after half the batches."""
    c = STEP_CASES[case]
    trainer, callbacks = c.build(gpu)
    step = trainer.training_step
    if not graph:
        step.evaluation_graph = None
    rng = np.random.default_rng(0)
    x, y = c.batch(rng)
    step(gpu.asarray(x), gpu.asarray(y), callbacks)
    sums = trainer.tracker.zeros()
    trainer.model.eval()
    scores = []
    for k in range(batches + 1):
        if middle is not None and k == batches // 2:
            middle(trainer)
        x, y = c.batch(rng)
        if k == batches:
            x, y = x[:11], y[:11]  # the last, smaller batch: the ordinary path
        total, correct = step.evaluate(gpu.asarray(x), gpu.asarray(y), sums)
        scores.append((to_host(total), to_host(correct)))
    trainer.model.train()
    return trainer, scores, None if sums is None else to_host(sums)


def evaluates_uncaptured(case) -> bool:
    """Whether a case's evaluation keeps the ordinary path: an Embedding checks its batch's
    indices on the host there, to name one outside the table."""
    return any(isinstance(layer, dict) and layer["type"] == "Embedding" for layer in STEP_CASES[case].layers)


# the step cases whose step CUDA cannot capture: batched matrix products (attention's scores and
# weighted values) reach cuBLAS through CuPy, which refuses them while a stream is captured, so
# the step keeps the ordinary path (the value: a part of the reason it gives)
UNCAPTURED = {"transformer pieces (attention: causal, dropout; positions, position-wise Linear, pooling), Adam":
              "MultiHeadAttention"}


def same_training(a, b, rtol: float = 0.0):
    """Two results of :func:`train_steps` hold the same bits (``rtol`` 0), or agree to ``rtol``
    relative to each array's largest magnitude."""
    (_, w0, s0, scores0, sums0), (_, w1, s1, scores1, sums1) = a, b
    assert w0.keys() == w1.keys() and s0.keys() == s1.keys()

    def same(got, want, what):
        if rtol:
            scale = float(np.max(np.abs(want))) if np.size(want) else 0.0
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)

    for k in w0:
        same(w1[k], w0[k], k)
    for k in s0:
        same(s1[k], s0[k], f"optimizer {k}")
    for (t0, c0), (t1, c1) in zip(scores0, scores1):
        if rtol and t0 is not None and t1 is not None:
            same(np.float64(t1), np.float64(t0), "the step's loss")
            assert c1 == c0 or abs(c1 - c0) <= 1  # (a sample on the line between two classes may tip)
        else:
            assert t1 == t0 and c1 == c0
    if sums0 is None or sums1 is None:
        assert sums0 is None and sums1 is None
    else:
        same(sums1, sums0, "the metric sums")
