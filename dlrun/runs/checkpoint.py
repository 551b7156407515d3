"""Checkpoints: one ``.npz`` file of plain arrays plus a JSON metadata record. Never pickled.

Layout of the archive: ``model/<qualified name>`` for every parameter and layer state,
``optimizer/<param>/<slot>`` for optimizer state, and ``meta`` (a uint8 array holding UTF-8
JSON: format version, dlrun version, epoch, step, RNG states, the resolved config, plugins).
Writes are atomic: a temporary file in the same folder, fsync, then rename.
"""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError

FORMAT = 1


def save(path: str | Path, model_arrays: dict, optimizer_arrays: dict | None, meta: dict) -> Path:
    """Write a checkpoint atomically; a crash mid-write leaves any previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_arrays.items()}
    arrays.update({f"optimizer/{k}": np.asarray(v) for k, v in (optimizer_arrays or {}).items()})
    meta = {"format": FORMAT, **meta}
    arrays["meta"] = np.frombuffer(json.dumps(meta, default=str).encode(), dtype=np.uint8)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # say which file could not be written
            e.filename = str(path)
        raise
    return path


def load(path: str | Path) -> tuple[dict, dict, dict]:
    """Read a checkpoint: (model arrays, optimizer arrays, meta). Raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):
        if path.suffix.lower() in (".yaml", ".yml"):
            raise CheckpointError(f"{path}: a config file, not a checkpoint; train it first (dlrun train {path}) and "
                                  f"give the run directory")
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as z:
            files = list(z.files)
            if "meta" not in files:
                raise CheckpointError(f"{path}: not a dlrun checkpoint (no 'meta' record)")
            model, optim = {}, {}
            for k in files:
                if k.startswith("model/"):
                    model[k[6:]] = z[k]
                elif k.startswith("optimizer/"):
                    optim[k[10:]] = z[k]
                elif k != "meta":  # read, so that a pickled record is refused as such (below)
                    z[k]
                    raise CheckpointError(f"{path}: not a dlrun checkpoint: unexpected record {k!r} (it holds "
                                          f"model/*, optimizer/* and meta only)")
            meta = json.loads(bytes(z["meta"]).decode())
    except CheckpointError:
        raise
    except MemoryError:
        raise CheckpointError(f"{path}: corrupt checkpoint (an array header asks for more memory than exists)") from None
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise CheckpointError(f"{path}: the checkpoint contains pickled objects; refusing to load it "
                                  f"(loading would run code)") from None
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({e})") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: corrupt checkpoint (the 'meta' record is not a JSON object)")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r} is not supported (expected {FORMAT})")
    for key, (ok, expected) in _META.items():
        if key in meta and not ok(meta[key]):
            raise CheckpointError(f"{path}: corrupt checkpoint: meta.{key}: expected {expected}, got {meta[key]!r:.80}")
    for group, arrays in (("model", model), ("optimizer", optim)):
        for k, a in arrays.items():
            if a.dtype.kind not in "biuf":
                raise CheckpointError(f"{path}: corrupt checkpoint: {group}/{k}: expected numbers, got an array of "
                                      f"dtype {a.dtype}")
    return model, optim, meta


def read_meta(path: str | Path) -> dict:
    """A checkpoint's metadata record alone, without reading its arrays (``dlrun runs`` reads
    many); a CheckpointError when the file is no readable checkpoint."""
    try:
        with zipfile.ZipFile(path) as z, z.open("meta.npy") as f:
            meta = json.loads(bytes(np.lib.format.read_array(f, allow_pickle=False)).decode())
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: corrupt checkpoint (the 'meta' record is not a JSON object)")
    return meta


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _dicts(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


# what dlrun.runs.snapshot writes into meta, checked where present so that a damaged or hand-edited
# record is a CheckpointError naming the key, not a crash deep in restoring it
_META = {
    "config": (lambda v: isinstance(v, dict), "a mapping"),
    "input_shape": (lambda v: isinstance(v, list) and all(_count(d) and d > 0 for d in v), "a list of positive integers"),
    "dtype": (lambda v: v in ("float32", "float64"), "float32 or float64"),
    "device": (lambda v: isinstance(v, str), "a device name"),
    "epoch": (_count, "a non-negative integer"),
    "step": (_count, "a non-negative integer"),
    "plugins": (lambda v: _dicts(v) and all(isinstance(x.get("path"), str) for x in v), "a list of plugin records"),
    "controls": (lambda v: _dicts(v) and all(isinstance(x.get("state"), dict) for x in v), "a list of control states"),
    "rng": (lambda v: isinstance(v, dict) and isinstance(v.get("layers", {}) or {}, dict)
            and (v.get("ranks") is None or (_dicts(v["ranks"]) and len(v["ranks"]) > 1)),
            "a mapping of generator states"),
    "best": (lambda v: v is None or isinstance(v, dict), "null or a mapping"),
    "preprocess": (lambda v: isinstance(v, dict), "a mapping"),
}


@dataclass
class Checkpoint:
    """A loaded checkpoint: parameter/state arrays, optimizer arrays and the metadata record."""

    path: Path
    model: dict
    optimizer: dict
    meta: dict


def read(path: str | Path) -> Checkpoint:
    """:func:`load` as a :class:`Checkpoint`."""
    model, optim, meta = load(path)
    return Checkpoint(Path(path), model, optim, meta)


def resolve(target: str | Path) -> Path:
    """The checkpoint file a command argument names.

    A run directory means its ``checkpoints/best.npz`` when present, else ``checkpoints/last.npz``;
    a file path is used as given.
    """
    p = Path(target)
    if p.is_dir():
        for name in ("best.npz", "last.npz"):
            if (p / "checkpoints" / name).is_file():
                return p / "checkpoints" / name
        raise CheckpointError(f"{p}: no checkpoints/best.npz or checkpoints/last.npz in this folder "
                              f"(expected a run directory written by dlrun train, or a .npz checkpoint)")
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p} (expected a run directory or a .npz checkpoint)")
    return p
