"""The seeding plan: every random stream of a run, derived from two numbers.

A run has a **run seed** (``seed:``, or ``--seed``; a fresh one is drawn and recorded when
neither is given) and a **split seed** (``train.split_seed``; unset, the run seed stands in for
it). From them (numpy ``SeedSequence`` children, so the streams are independent of each other)::

    SeedSequence(run seed)
    ├── child 0  initial weights: one host generator, drawn from layer by layer in model order
    ├── child 1  each layer's runtime generator (dropout masks, noise): child i of it for model[i]
    └── child 2  shuffling: the order of every epoch's batches
    split seed   the validation split: one generator that draws the held-out samples
    data seed    a data generator's own ``data.seed`` option (its default otherwise): the data
                 does not change with the run seed, so runs with other seeds see the same samples
    SeedSequence([run seed, step])  a resumed run's layer generators on a device whose generator
                 has no state to save (CuPy): child i for model[i], from the step it resumes at

A data-parallel run (``mpiexec -n K``) draws the same initial weights and shuffling on every rank;
rank r > 0 draws its layers' runtime numbers from child r of each layer's stream (rank 0 from
the stream itself, as one process). Its checkpoints hold every rank's generator states, so a
resume on K ranks continues each rank's streams; a resume on another number of ranks continues
rank 0's, and rank r > 0 draws from SeedSequence([run seed, step, r]).

Every stream above is made here, and only here.
"""
from __future__ import annotations

import numpy as np

_INITIAL, _LAYERS, _SHUFFLE = range(3)


def generator_state(gen) -> dict | None:
    """A numpy Generator's bit-generator state (JSON-ready), or None for other generators (CuPy's
    expose none)."""
    return gen.bit_generator.state if isinstance(gen, np.random.Generator) else None


def layer_states(layers) -> dict:
    """``{"i": state}`` of the runtime generator of each layer ``model[i]`` that has made one (what
    checkpoints record, and what :func:`generator_state` gives for it)."""
    return {str(i): generator_state(layer.rng_made) for i, layer in enumerate(layers) if layer.rng_made is not None}


def fresh_seed() -> int:
    """A new run seed, for a run that names none (recorded in its config.yaml and checkpoints)."""
    return int(np.random.SeedSequence().entropy % (2**31))


def _children(seed: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence(seed).spawn(3)


def initial_weights(seed: int) -> np.random.Generator:
    """The host generator the layers draw their initial weights from, in model order."""
    return np.random.default_rng(_children(seed)[_INITIAL])


def layer_streams(seed: int, layers: int, rank: int = 0) -> list[np.random.SeedSequence]:
    """The seed of each layer's runtime generator (``layer.rng``), for ``model[0] ... model[n-1]``.
    Rank ``rank`` > 0 of a data-parallel run draws its own streams: child ``rank`` of each layer's."""
    streams = _children(seed)[_LAYERS].spawn(layers)
    if rank == 0:
        return streams
    return [np.random.SeedSequence(s.entropy, spawn_key=(*s.spawn_key, rank)) for s in streams]


def shuffling(seed: int) -> np.random.Generator:
    """The generator that draws each epoch's order of the training samples."""
    return np.random.default_rng(_children(seed)[_SHUFFLE])


def split_seed(run_seed: int | None, split_seed: int | None) -> int | None:
    """The seed of the validation split: ``train.split_seed``, or the run seed standing in for it."""
    return run_seed if split_seed is None else split_seed


def split_stream(seed: int | None) -> np.random.Generator:
    """The generator that draws the validation samples (from :func:`split_seed`)."""
    return np.random.default_rng(seed)


def data_stream(seed: int | None) -> np.random.Generator:
    """A data generator's own generator, from its ``seed`` option."""
    return np.random.default_rng(seed)


def resumed_layer_streams(seed: int, step: int, layers: int, rank: int = 0) -> list[np.random.SeedSequence]:
    """Fresh, deterministic layer generators for a run resumed at ``step`` on a device whose
    generators have no state to save (CuPy), and for ranks other than 0 of a data-parallel run
    whose checkpoint holds no states for them (written on another number of ranks, or by a
    dlrun that kept rank 0's alone): reproducible, though not the stream an uninterrupted run
    would have drawn."""
    return np.random.SeedSequence([seed, step] + ([rank] if rank else [])).spawn(layers)
