"""Checks that the data, the model and the loss fit together, made before a run writes a file
or a command reads a checkpoint's data: labels the model has outputs for, targets shaped like its
outputs, and one class weight per class (``balanced`` ones computed from the training labels);
and the warnings of data that trains badly: features of very different scales with no scaling,
a first loss far above chance level."""
from __future__ import annotations

import math

import numpy as np

from ..backend import format_bytes, to_host
from ..data import Dataset, check_indices
from ..data.pieces import magnitudes
from ..data.preprocess import scale_spread
from ..errors import ConfigError, DataError
from ..losses import Loss
from ..losses.base import BALANCED
from ..model import Sequential


def check_class_weights(loss, model: Sequential, where=None) -> None:
    """A loss's ``class_weights`` must hold one weight per class the model's outputs score;
    ``where``: the config location of loss.class_weights."""
    check = getattr(loss, "check_weights", None)  # plugin losses need not subclass Loss
    problem = check(model.output_shape[-1] if model.output_shape else 1) if check else None
    if problem:
        raise ConfigError(problem if where else f"loss.class_weights: {problem}", where)


def balance_class_weights(loss, model: Sequential, y, config=None) -> None:
    """Resolve ``class_weights: balanced`` from the training labels ``y`` (Loss.balance). With
    ``config``, errors name its line, and the weights replace "balanced" in its loss spec
    (``config.raw``), so the run directory and checkpoints hold the weights that were trained
    with, and evaluate, predict and --resume use them whatever data they are given."""
    if getattr(loss, "class_weights", None) != BALANCED:  # (labels stay on the device)
        return
    problem = loss.balance(to_host(y), model.output_shape[-1] if model.output_shape else 1)
    where = config.locate("loss.class_weights") if config is not None else None
    if problem:
        raise ConfigError(problem if where else f"loss.class_weights: {problem}", where)
    spec = config.raw.get("loss") if config is not None else None
    if isinstance(spec, dict) and spec.get("class_weights") == BALANCED:
        spec["class_weights"] = list(loss.class_weights)


def check_label_range(loss, model: Sequential, lo: int, hi: int) -> None:
    """Raise a DataError when labels from ``lo`` to ``hi`` are not classes the model scores."""
    check_class_weights(loss, model)
    outputs = model.output_shape[-1] if model.output_shape else 1
    check = getattr(loss, "check_outputs", None)  # plugin losses need not subclass Loss
    problem = (f"has a negative label ({lo}); labels are class indices 0, 1, ..." if lo < 0
               else check(hi + 1, outputs) if check else None)
    if problem:
        raise DataError(f"labels: the data {problem}")


def check_model_indices(ds: Dataset, model: Sequential) -> None:
    """For a model whose input goes to a layer that takes indices (Embedding; in a graph, any node
    reading the input): every sample's values are whole numbers within the layer's bound, or a
    DataError naming the sample (file:line for a CSV)."""
    for i in model.reads_input():
        layer = model.layers[i]
        spec = getattr(layer, "input_spec", None)
        if getattr(spec, "kind", "") == "index":
            check_indices(ds, f"{model.label(i)} {type(layer).__name__}", spec.index_bound(layer))


def check_batch_memory(model: Sequential, batch: int, where=None) -> None:
    """ConfigError (at ``where``: train.batch_size) when one batch's activations cannot fit in the
    memory the model's device has left. A training step holds each layer's output and the
    gradient it passes back (fast mode keeps one buffer for each), so 2 × batch × Σ outputs ×
    itemsize is a lower bound of its peak; caches come on top (measured peaks: 2–3 times the
    bound). Over it, Linux would grant the arrays and kill the process, with no message, when
    they are written; CuPy would fail in the middle of the first step."""
    free = model.backend.memory_available()
    if free is None:
        return
    per_sample = 2 * sum(int(np.prod(s, dtype=np.float64)) for s in model.shapes) * model.dtype.itemsize
    if batch * per_sample > free:
        fits = int(free // per_sample)
        kind = "memory" if model.backend.name == "cpu" else "GPU memory"
        raise ConfigError(f"a batch of {batch} needs at least {format_bytes(batch * per_sample)} for the layers' "
                          f"outputs and their gradients ({format_bytes(per_sample)} a sample), more than the "
                          f"{format_bytes(free)} of {kind} available; "
                          + (f"make train.batch_size at most {fits}" if fits else "make the model's layers smaller"),
                          where)


def check_labels(ds: Dataset, model: Sequential, loss, locate=None) -> None:
    """Fail early when labels cannot index the model's outputs, or targets do not match them.
    ``locate`` (a config's): the error is placed at the last layer, or the loss, that the
    message asks to change (the data row, when there is one, stays in the message)."""
    at = locate or (lambda path: None)  # noqa: E731
    last = at(model.label(len(model.layers) - 1))
    if getattr(loss, "task", "classification") != "classification":
        outputs = int(np.prod(model.output_shape)) if model.output_shape else 1
        targets = int(np.prod(ds.y.shape[1:])) if ds.y.ndim > 1 else 1
        if outputs != targets:
            raise DataError(f"data {ds.name!r}: the loss {type(loss).__name__} compares each sample's {outputs} model "
                            f"outputs with its {targets} target value(s); make the last layer output {targets} "
                            f"(units: {targets}) or give {outputs} target columns"
                            + (" (integer class labels want a classification loss such as SoftmaxCrossEntropy)"
                               if ds.y.dtype.kind in "iu" else ""), at("loss") if ds.y.dtype.kind in "iu" else last)
        return
    if ds.y.dtype.kind not in "iu":
        raise DataError(f"data {ds.name!r}: a classification loss needs integer labels, got {ds.y.dtype} targets"
                        f" (use a regression loss such as MSE; a loss of your own for regression sets "
                        f"task = \"regression\")", at("loss"))
    out = model.output_shape[-1] if model.output_shape else 1
    classes = ds.num_classes or 0
    check = getattr(loss, "check_outputs", None)  # plugin losses need not subclass Loss
    problem = check(classes, out) if check else Loss.check_outputs(loss, classes, out)
    if not problem:
        return
    limit = max(out, 2) if out == 1 else out  # one logit scores labels 0 and 1
    for y, val in ((ds.y, False), (ds.y_val, True)):
        if y is not None and (y >= limit).any():
            i = int(np.flatnonzero(y >= limit)[0])
            raise DataError(f"{ds.where(i, val)}: label {int(y[i])} is out of range: the model outputs {out} "
                            f"scores, so labels must lie in 0..{limit - 1} (set the last layer's units to "
                            f"{ds.num_classes})", last)
    raise DataError(f"data {ds.name!r} {problem}", at("loss"))


SCALE_SPREAD = 100.0  # largest / smallest feature magnitude that asks for scaling (two orders of magnitude)
CHANCE_FACTOR = 10.0  # a first loss this many times log(C) is far above chance


def scale_warning(ds: Dataset) -> str | None:
    """A warning when the training features' magnitudes (largest absolute value of each) differ by
    SCALE_SPREAD or more and data.preprocess scales nothing: the large ones swamp the first layer."""
    if ds.preprocess is not None and ds.preprocess.settings.numeric != "none":
        return None
    found = scale_spread(ds.x)
    if found is None or found[0] < SCALE_SPREAD:
        return None
    ratio, big, small = found
    names = (ds.preprocess.output_names if ds.preprocess is not None else None) or ds.columns
    top = magnitudes(ds.x)

    def named(j):
        return repr(names[j]) if names is not None and len(names) == len(top) else f"feature {j + 1}"
    return (f"data {ds.name!r}: features differ in scale by {math.log10(ratio):.0f} orders of magnitude ({named(big)} "
            f"up to {top[big]:.4g}, {named(small)} up to {top[small]:.4g}) and nothing scales them; "
            f"add data.preprocess: {{numeric: standardize}} (fitted on the training split and saved with the model)")


def chance_warning(first_loss: float, model: Sequential, loss) -> str | None:
    """A warning when a classification loss on the first batch, before any training, is
    CHANCE_FACTOR times log(C) or more for C classes: inputs (or initial weights) far too large."""
    if getattr(loss, "task", "classification") != "classification" or not math.isfinite(first_loss):
        return None
    outputs = model.output_shape[-1] if model.output_shape else 1
    classes = loss.classes(outputs) if hasattr(loss, "classes") else outputs
    chance = math.log(max(classes, 2))
    if first_loss < CHANCE_FACTOR * chance:
        return None
    return (f"the first batch's loss {first_loss:.4g} is {first_loss / chance:.0f} times chance level (log {max(classes, 2)} "
            f"= {chance:.3g} for {max(classes, 2)} classes): the inputs (or the initial weights) are far too large; "
            f"scale the features with data.preprocess: {{numeric: standardize}}")
