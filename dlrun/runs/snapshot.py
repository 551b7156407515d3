"""A training run's full state <-> a checkpoint: capture, restore, and the checkpoint callback.

A checkpoint records every parameter and declared layer state, the optimizer's buffers and step
count, the epoch and step, the RNG states (the trainer's shuffling generator and each layer's
``rng``, as JSON), the resolved config, the dlrun version, and every plugin file with the
sha256 of its source. Restoring all of it makes a resumed CPU run bit-identical to one that
never stopped; a data-parallel run's checkpoints hold every rank's layer generators, so that a
resume on as many ranks is too. On GPU, CuPy generators expose no state: layer generators are
re-seeded from the run seed and the step on resume (deterministic, but a different stream).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import __version__, registry, seeding
from . import checkpoint
from ..config import Config
from ..config.graph import is_chain, lower
from ..data import Dataset
from ..data.preprocess import Preprocessing
from ..errors import CheckpointError, Location
from ..model import layer_types
from ..model.graph import Graph
from ..metrics.monitor import improved
from ..registry.plugins import loaded_files, source_hash
from ..training.position import EpochPosition
from ..training.hooks import Callback
from ..training.trainer import Trainer


def plugin_records(config: Config) -> list[dict]:
    """Each plugin file the run used: resolved path, sha256, and the components it registers.

    The config's ``plugins:`` files, and those given with ``--plugin`` that define a component
    the config names, so that predict, evaluate and --resume can say which ``--plugin`` to pass."""
    def defined_by(path: Path) -> list[str]:
        return sorted(name for reg in registry.REGISTRIES.values() for name in reg._entries
                      if reg.origin(name) not in ("builtin", None) and Path(reg.origin(name)).resolve() == path)

    named = set(_strings(config.raw))
    paths = [Path(p).resolve() for p in config.plugins]
    paths += [Path(p) for p in loaded_files() if Path(p) not in paths and named & set(defined_by(Path(p)))]
    return [{"path": str(path), "sha256": source_hash(path) if path.is_file() else None, "defines": defined_by(path)}
            for path in paths]


def _strings(value):
    """Every string in a parsed config (component names among them)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


class HostCopies:
    """Host copies of a model's and optimizer's arrays for a checkpoint, made without waiting for
    the device: on the GPU each array is queued for an asynchronous copy into page-locked host
    memory, kept between calls and refilled in place (one set per use: the pending best state,
    the state being written), and :meth:`ready` waits once, for all of them, before they are
    written to disk. On the CPU they are plain copies."""

    def __init__(self, backend):
        self.backend = backend
        self.buffers: dict = {}

    def take(self, arrays: dict, group: str) -> dict:
        """Copies of ``arrays`` (name to array or number); ``group`` keeps their buffers apart."""
        b = self.backend
        xp = b.xp
        if xp is np:
            return {k: np.array(v) for k, v in arrays.items()}
        out, pairs = {}, []
        for k, v in arrays.items():
            if not isinstance(v, xp.ndarray):  # a number, or a host array
                out[k] = np.array(v)
                continue
            buf = self.buffers.get((group, k))
            if buf is None or buf.shape != v.shape or buf.dtype != v.dtype:
                buf = self.buffers[(group, k)] = b.host_buffer(v.shape, v.dtype)
            pairs.append((buf, v))
            out[k] = buf
        b.copy_out(pairs)
        return out

    def ready(self) -> None:
        """Wait until every queued copy has landed (before the copies are read)."""
        self.backend.synchronize()


def capture(trainer: Trainer, config: Config, extra: dict | None = None,
            copies: tuple[HostCopies, str] | None = None) -> tuple[dict, dict, dict]:
    """Host copies of (model arrays, optimizer arrays, meta) for the trainer's current state.
    ``copies`` (a :class:`HostCopies` and its group) queues them, to be read after its ``ready``;
    without it each array is read back at once."""
    model = trainer.model
    state = trainer.state_dict()
    # copies, not views: a pending best.npz must not follow the live buffers
    to_host = model.backend.to_host

    def take(arrays: dict) -> dict:
        if copies is not None:
            return copies[0].take(arrays, copies[1])
        return {k: np.array(to_host(v)) for k, v in arrays.items()}

    optim = take(state["optimizer"])
    meta = {"dlrun_version": __version__, "epoch": state["epoch"], "step": state["step"],
            "config": config.raw, "split_shares": config.split_shares,
            "input_shape": list(model.input_shape), "dtype": str(model.dtype),
            "device": model.backend.name,
            "rng": {"shuffle": state["shuffle"],
                    "layers": seeding.layer_states(model.layers),
                    # several ranks: each rank's, gathered when the epoch ended or training stopped
                    **({"ranks": trainer.rank_states} if trainer.rank_states is not None else {})},
            "position": state["position"].to_meta() if state["position"] is not None else None,
            "plugins": plugin_records(config),
            "controls": state["controls"], **(extra or {})}
    if isinstance(model, Graph):  # the layer of each node, which check_fits compares
        meta["nodes"] = layer_types(model)
    return take(model.device_state()), optim, meta


def preprocess_meta(ds: Dataset) -> dict:
    """The checkpoint metadata of a run's fitted preprocessing (``{"preprocess": record}``), or {}."""
    return {} if ds.preprocess is None else {"preprocess": ds.preprocess.record()}


def recorded_preprocessing(ckpt: checkpoint.Checkpoint) -> Preprocessing | None:
    """The preprocessing a checkpoint recorded (None for a run without one: its inputs are used as
    given, as before preprocessing was saved)."""
    rec = ckpt.meta.get("preprocess")
    if rec is None:
        return None
    try:
        return Preprocessing.from_record(rec, str(ckpt.path))
    except ValueError as e:
        raise CheckpointError(f"{ckpt.path}: corrupt checkpoint: meta.preprocess: {e}") from None


def write(path: Path, trainer: Trainer, config: Config, extra: dict | None = None,
          copies: HostCopies | None = None) -> Path:
    """Write the trainer's state to ``path`` atomically (``copies``: through its buffers, with one
    wait for the device, not one per array)."""
    if copies is None:
        return checkpoint.save(path, *capture(trainer, config, extra))
    state = capture(trainer, config, extra, (copies, "write"))
    copies.ready()
    return checkpoint.save(path, *state)


def load_weights(model, ckpt: checkpoint.Checkpoint) -> None:
    """Copy a checkpoint's parameters and layer state into ``model`` (names and shapes must match)."""
    model.load_state_arrays(ckpt.model, ckpt.path, ckpt.meta)


def restore(trainer: Trainer, ckpt: checkpoint.Checkpoint, seed: int, frozen=()) -> str | None:
    """Put a trainer back into the state a checkpoint recorded: weights, optimizer, counters, RNGs.
    ``frozen``: the resumed config's ``trainable: false`` layers (see :func:`frozen_changed`).

    Returns a warning when layers that draw random numbers cannot continue every stream: the
    checkpoint was written on another number of ranks (each rank of a data-parallel run draws
    its own); rank 0 then continues the recorded streams and every other rank draws fresh ones
    (:func:`dlrun.seeding.resumed_layer_streams`)."""
    load_weights(trainer.model, ckpt)
    opt = trainer.optimizer
    wanted = set(opt.state_dict())
    if set(ckpt.optimizer) != wanted:
        changed = frozen_changed(ckpt.meta.get("config"), frozen)
        if changed:
            raise CheckpointError(f"{ckpt.path}: {changed} since the run started, and the optimizer keeps state "
                                  f"only for the layers that train; a resumed run keeps them. To change which "
                                  f"layers train, start a new run from these weights: dlrun train CONFIG "
                                  f"--init-from {ckpt.path}")
        missing = sorted(wanted - set(ckpt.optimizer))
        extra = sorted(set(ckpt.optimizer) - wanted)
        raise CheckpointError(f"{ckpt.path}: the optimizer state does not fit the configured {opt!r}"
                              + (f"; missing: {', '.join(missing[:6])}" if missing else "")
                              + (f"; unexpected: {', '.join(extra[:6])}" if extra else "")
                              + " (resume with the optimizer the run was trained with)")
    b = trainer.backend
    meta = ckpt.meta
    position = EpochPosition.from_meta(meta.get("position"), str(ckpt.path))
    rng = meta.get("rng") or {}
    # mid-epoch: the shuffling state before the epoch's order was drawn, so it is drawn again
    trainer.load_state_dict({"epoch": meta["epoch"], "step": meta["step"], "position": position,
                             "shuffle": position.shuffle if position is not None else rng.get("shuffle"),
                             "optimizer": ckpt.optimizer, "controls": meta.get("controls")})
    model = trainer.model
    layers, world = model.layers, model.world
    ranks = rng.get("ranks")  # several ranks: each rank's states (older checkpoints hold rank 0's alone)
    recorded = len(ranks) if ranks is not None else 1
    states = ranks[world.rank] if recorded == world.size and ranks is not None else rng.get("layers") or {}
    if world.writes and recorded == world.size:  # what a checkpoint records until the ranks next gather theirs
        trainer.rank_states = ranks
    own = world.rank == 0 or recorded == world.size  # else: ranks the checkpoint holds no states for
    reseed = seeding.resumed_layer_streams(seed, trainer.step, len(layers), world.rank)
    for i, layer in enumerate(layers):
        state = states.get(str(i))
        if b.xp is not np or not own:  # a CuPy generator has no exportable state: a fresh, deterministic stream
            layer.seed_rng(reseed[i])
        elif state is not None and layer.rng is not None:
            layer.rng.bit_generator.state = state
        # else: no generator made before the checkpoint; the one the model's seed makes later
        # draws what it would have drawn in an uninterrupted run
    drawing = [f"{model.label(i)} {type(layer).__name__}" for i, layer in enumerate(layers) if layer.stochastic]
    if recorded == world.size or not drawing or b.xp is not np:
        return None
    held = f"{recorded} ranks" if recorded > 1 else "one process (or rank 0 alone)"
    fresh = ("rank 1" if world.size == 2 else f"ranks 1 to {world.size - 1}") if world.size > 1 else None
    return (f"{ckpt.path} holds the random generator states of {held} and the run resumes on "
            f"{f'{world.size} ranks' if world.size > 1 else 'one process'}: {', '.join(drawing)} continue"
            f"{'s' if len(drawing) == 1 else ''} rank 0's streams"
            + (f", {fresh} draw{'s' if world.size == 2 else ''} fresh ones from the run seed and step {trainer.step}"
               if fresh else "")
            + "; reproducible, but not the random numbers the run would have drawn on its own number of ranks")


def frozen_changed(recorded: dict | None, frozen) -> str | None:
    """'model[0].trainable changed (false -> true)' when the recorded config froze other layers
    (a graph's: other nodes) than ``frozen``, else None."""
    model = (recorded or {}).get("model") if isinstance(recorded, dict) else None
    if not isinstance(model, list):
        return None
    if is_chain(model):
        before = {i for i, s in enumerate(model) if isinstance(s, dict) and s.get("trainable") is False}
        paths = {i: f"model[{i}]" for i in before | set(frozen)}
    else:
        nodes, _ = lower(model, lambda path: Location(path=path))
        before = {k for k, n in enumerate(nodes) if n.frozen}
        paths = {k: n.node.path for k, n in enumerate(nodes)}
    moved = sorted(before ^ set(frozen))
    if not moved:
        return None
    return ", ".join(f"{paths.get(i, f'model[{i}]')}.trainable changed ({'false -> true' if i in before else 'true -> false'})"
                     for i in moved)


class CheckpointWriter(Callback):
    """Writes ``last.npz`` every ``every`` epochs and at the end, and ``best.npz`` by a metric.

    The best state is copied to host memory when the metric improves and written with the next
    ``last.npz``, so both files always describe a moment the run actually passed through. On the
    GPU those copies are queued into page-locked memory (:class:`HostCopies`): the host waits for
    the device once per checkpoint written, not once per array nor at each better epoch.
    """

    def __init__(self, folder: Path, config: Config, every: int, monitor: str, mode: str,
                 best: dict | None = None, extra: dict | None = None, min_delta: float = 0.0):
        self.folder, self.config, self.every = Path(folder), config, every
        self.monitor, self.mode, self.min_delta = monitor, mode, min_delta
        self.best = best if best and best.get("monitor") == monitor else None
        self.extra = extra or {}
        self._pending = None
        self._written_epoch = None
        self.copies = None

    def on_train_begin(self, trainer):
        self.trainer = trainer
        self.copies = HostCopies(trainer.backend)
        self._written_epoch = trainer.epoch
        if self._best_lost(trainer):  # resumed at the best epoch, whose best.npz a full disk refused
            self._pending = capture(trainer, self.config, {**self.extra, "best": self.best}, (self.copies, "best"))

    def _best_lost(self, trainer) -> bool:
        """Whether the state resumed from is the recorded best epoch's and best.npz does not hold
        it (last.npz is written first: a disk that filled after it left best.npz missing or older)."""
        if self.best is None or self.best.get("epoch") != trainer.epoch or trainer.position is not None:
            return False
        try:
            kept = checkpoint.read(self.folder / "best.npz").meta.get("best") or {}
        except CheckpointError:  # missing or unreadable
            return True
        return kept.get("epoch") != self.best["epoch"] or kept.get("monitor") != self.best["monitor"]

    def _improved(self, value) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return improved(value, self.best["value"], self.mode, self.min_delta)

    def on_epoch_end(self, epoch, metrics):
        value = metrics.get(self.monitor)
        if self._improved(value):
            self.best = {"monitor": self.monitor, "mode": self.mode, "value": float(value), "epoch": epoch}
            # (queued: on the GPU the host does not wait until the state is written)
            self._pending = capture(self.trainer, self.config, {**self.extra, "best": self.best}, (self.copies, "best"))
        if epoch % self.every == 0:
            self.flush()

    def on_train_end(self, history):
        if self._written_epoch != self.trainer.epoch or self._pending is not None:
            self.flush()

    def flush(self, extra: dict | None = None) -> None:
        """Write last.npz (``extra`` adds to its metadata), then the pending best.npz: a disk that
        fills between the two leaves the run resumable (a resume whose best.npz is older than
        last.npz's record of the best has lost those weights only)."""
        # (the wait for the copies of last.npz's arrays covers the pending best's, queued before)
        write(self.folder / "last.npz", self.trainer, self.config, {**self.extra, "best": self.best, **(extra or {})},
              self.copies)
        self._written_epoch = self.trainer.epoch
        if self._pending is not None:
            checkpoint.save(self.folder / "best.npz", *self._pending)
            self._pending = None
