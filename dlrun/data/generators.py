"""Synthetic data generators for classification and regression toys, all seeded.

Each returns a :class:`~dlrun.data.Dataset` of float64 features (N, D) and int64 labels (N,)
for classification, or float64 targets (N, 1) for regression (``sine``; ``adding``, whose
features are sequences (N, T, 2)); ``lookup``'s features are token sequences (N, T). The same
seed gives the same data; a validation part is split off by ``train.validation_split`` (stratified).
"""
from __future__ import annotations

import math
from typing import Annotated

import numpy as np

from .. import seeding
from . import Dataset
from ..registry.options import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Range
from ..registry import data

AtLeastTwo = Annotated[int, Range(min=2)]


@data.register("moons")
def moons(samples: AtLeastTwo = 200, noise: NonNegativeFloat = 0.1, seed: NonNegativeInt = 0) -> Dataset:
    """Two interleaving half circles (as sklearn's make_moons), 2 classes.

    Class 0: (cos t, sin t); class 1: (1 − cos t, 0.5 − sin t), t = linspace(0, π) for each;
    then N(0, noise²) is added to every coordinate. Class 0 gets ⌊samples/2⌋ points.

    Args:
        samples: total number of points.
        noise: standard deviation of the Gaussian noise added to the points.
        seed: seed of the noise.
    """
    n0 = samples // 2
    n1 = samples - n0
    t0, t1 = np.linspace(0.0, math.pi, n0), np.linspace(0.0, math.pi, n1)
    x = np.concatenate([np.stack([np.cos(t0), np.sin(t0)], 1), np.stack([1.0 - np.cos(t1), 0.5 - np.sin(t1)], 1)])
    x += noise * seeding.data_stream(seed).standard_normal(x.shape)
    y = np.repeat(np.array([0, 1], dtype=np.int64), [n0, n1])
    return Dataset(x, y, name="moons")


@data.register("circles")
def circles(samples: AtLeastTwo = 200, noise: NonNegativeFloat = 0.05,
            factor: Annotated[float, Range(0, 1, min_inclusive=False, max_inclusive=False)] = 0.5,
            seed: NonNegativeInt = 0) -> Dataset:
    """A circle inside a circle (as sklearn's make_circles), 2 classes.

    Class 0: (cos t, sin t) on the unit circle; class 1: factor · (cos t, sin t), t evenly
    spaced over [0, 2π); then N(0, noise²) is added to every coordinate.

    Args:
        samples: total number of points (class 0 gets ⌊samples/2⌋).
        noise: standard deviation of the Gaussian noise.
        factor: radius of the inner circle relative to the outer one, in (0, 1).
        seed: seed of the noise.
    """
    n0 = samples // 2
    n1 = samples - n0
    t0 = np.linspace(0.0, 2 * math.pi, n0, endpoint=False)
    t1 = np.linspace(0.0, 2 * math.pi, n1, endpoint=False)
    x = np.concatenate([np.stack([np.cos(t0), np.sin(t0)], 1), factor * np.stack([np.cos(t1), np.sin(t1)], 1)])
    x += noise * seeding.data_stream(seed).standard_normal(x.shape)
    y = np.repeat(np.array([0, 1], dtype=np.int64), [n0, n1])
    return Dataset(x, y, name="circles")


@data.register("blobs")
def blobs(samples: PositiveInt = 300, classes: PositiveInt = 3, features: PositiveInt = 2,
          std: NonNegativeFloat = 1.0, box: PositiveFloat = 10.0, seed: NonNegativeInt = 0) -> Dataset:
    """Isotropic Gaussian clusters (as sklearn's make_blobs), one per class.

    Centres c_k ~ U[−box, box]^features; class k's points are c_k + N(0, std²·I). Classes get
    ⌊samples/classes⌋ points each, the first (samples mod classes) classes one more.

    Args:
        samples: total number of points.
        classes: number of clusters (and classes).
        features: dimension of the points.
        std: standard deviation of each cluster.
        box: centres are drawn uniformly in [−box, box] per coordinate.
        seed: seed of the centres and the points.
    """
    rng = seeding.data_stream(seed)
    centers = rng.uniform(-box, box, size=(classes, features))
    counts = np.full(classes, samples // classes)
    counts[: samples % classes] += 1
    y = np.repeat(np.arange(classes, dtype=np.int64), counts)
    x = centers[y] + std * rng.standard_normal((samples, features))
    return Dataset(x, y, name="blobs")


@data.register("xor")
def xor(samples: PositiveInt = 200, noise: NonNegativeFloat = 0.0, seed: NonNegativeInt = 0) -> Dataset:
    """The XOR problem: x ~ U[−1, 1]², label 1 when the two coordinates differ in sign.

    y = [x₁ > 0] xor [x₂ > 0], decided before N(0, noise²) is added to the points (so noise
    blurs the boundary along the axes). Not linearly separable: a linear model stays near 50 %.

    Args:
        samples: number of points.
        noise: standard deviation of the Gaussian noise added after labelling.
        seed: seed of the points and the noise.
    """
    rng = seeding.data_stream(seed)
    x = rng.uniform(-1.0, 1.0, size=(samples, 2))
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(np.int64)
    x += noise * rng.standard_normal(x.shape)
    return Dataset(x, y, name="xor")


@data.register("sine")
def sine(samples: PositiveInt = 200, low: float = -3.0, high: float = 3.0, amplitude: float = 1.0,
         frequency: float = 1.0, phase: float = 0.0, noise: NonNegativeFloat = 0.1, seed: NonNegativeInt = 0) -> Dataset:
    """Regression on a sine: x ~ U[low, high], y = amplitude · sin(frequency · x + phase) + N(0, noise²).

    Features have shape (N, 1) and targets (N, 1) (pair with a one-unit output and MSE or Huber).

    Args:
        samples: number of points.
        low: smallest x.
        high: largest x (must exceed low).
        amplitude: amplitude of the sine.
        frequency: angular frequency (radians per unit of x).
        phase: phase shift in radians.
        noise: standard deviation of the Gaussian noise added to the targets.
        seed: seed of the points and the noise.
    """
    if not high > low:
        raise ValueError(f"high must exceed low, got low={low}, high={high}")
    rng = seeding.data_stream(seed)
    x = rng.uniform(low, high, size=(samples, 1))
    y = amplitude * np.sin(frequency * x + phase) + noise * rng.standard_normal((samples, 1))
    return Dataset(x, y, name="sine")


@data.register("adding")
def adding(samples: PositiveInt = 2000, steps: AtLeastTwo = 20, seed: NonNegativeInt = 0) -> Dataset:
    """The adding problem (Hochreiter & Schmidhuber 1997): the sum of the two marked values of a sequence.

    Each sample is a sequence of ``steps`` pairs (value, marker), values ~ U[0, 1]; the marker is 1
    at one step of the first half and one of the second, else 0. The target is the sum of the two
    marked values, in [0, 2]. Predicting its mean, 1, scores MSE 1/6 ≈ 0.167 (the variance of a sum
    of two uniforms): a model well below that remembers a value over up to ``steps`` − 1 steps.

    Features have shape (N, steps, 2) and targets (N, 1): pair with an LSTM or SimpleRNN, a
    one-unit Linear and MSE.

    Args:
        samples: number of sequences.
        steps: length of each sequence.
        seed: seed of the values and the marked steps.
    """
    rng = seeding.data_stream(seed)
    values = rng.uniform(0.0, 1.0, (samples, steps))
    rows = np.arange(samples)
    first = rng.integers(0, steps // 2, samples)
    second = rng.integers(steps // 2, steps, samples)
    marks = np.zeros((samples, steps))
    marks[rows, first] = 1.0
    marks[rows, second] = 1.0
    x = np.stack([values, marks], axis=2)
    y = (values[rows, first] + values[rows, second])[:, None]
    return Dataset(x, y, name="adding")


@data.register("lookup")
def lookup(samples: PositiveInt = 3000, length: Annotated[int, Range(min=3)] = 8, vocabulary: AtLeastTwo = 10,
           seed: NonNegativeInt = 0) -> Dataset:
    """Find the token a pointer names: the first token p is a position, the label is the token at p.

    Each sample is a sequence of ``length`` integer tokens: x[0] = p ~ U{1, …, length − 1}, and
    x[1:] ~ U{0, …, vocabulary − 1}; the label is y = x[p], one of ``vocabulary`` classes. The
    answer depends on where each token stands, not only on which tokens occur: a model that
    pools the tokens' embeddings before it looks at them (a bag of embeddings) cannot tell the
    pointer from the other tokens, nor which token stands at p, while attention with learned
    positions can look p up.

    Features have shape (N, length), token indices in [0, max(vocabulary, length)) held as
    whole-number floats: start the model with an Embedding of that ``input_dim``. Labels (N,).

    Args:
        samples: number of sequences.
        length: tokens per sequence, the pointer included (at least 3).
        vocabulary: number of distinct tokens after the pointer, and of classes.
        seed: seed of the tokens and the pointers.
    """
    rng = seeding.data_stream(seed)
    x = rng.integers(0, vocabulary, (samples, length))
    x[:, 0] = rng.integers(1, length, samples)
    y = x[np.arange(samples), x[:, 0]].astype(np.int64)
    return Dataset(x.astype(np.float64), y, name="lookup")
