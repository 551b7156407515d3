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
from pathlib import Path

import numpy as np

from .errors import CheckpointError

FORMAT = 1


def save(path: str | Path, model_arrays: dict, optimizer_arrays: dict | None, meta: dict) -> Path:
    """Write a checkpoint atomically; a crash mid-write leaves any previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_arrays.items()}
    arrays.update({f"optimizer/{k}": np.asarray(v) for k, v in (optimizer_arrays or {}).items()})
    meta = {"format": FORMAT, **meta}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
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
            meta = json.loads(bytes(z["meta"]).decode())
    except CheckpointError:
        raise
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise CheckpointError(f"{path}: the checkpoint contains pickled objects; refusing to load it "
                                  f"(loading would run code)") from None
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({e})") from None
    except (OSError, zipfile.BadZipFile, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(e).__name__}: {e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format')!r} is not supported (expected {FORMAT})")
    return model, optim, meta
