"""The training steps that the GPU tests queue, shared by tests/backend/test_gpu.py (on a device)
and tests/backend/test_gpu_step_host_reads.py (on the CPU stand-in for CuPy).

Between them the cases hold every model part the step has a GPU branch for, and every
registered loss, optimizer, regularizer and ``train.metrics`` metric, with gradient clipping:
``covered`` says which, and a test fails when a newly registered component has no case.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlrun import metrics, registry
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
    "mlp+batchnorm+dropout, Adam, L2, clip_norm": StepCase(
        [{"type": "Linear", "units": 32}, {"type": "BatchNorm"}, "ReLU", {"type": "Dropout", "rate": 0.2},
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
    "recurrent (LSTM, GRU, SimpleRNN: the fused cells), Adam": StepCase(
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
