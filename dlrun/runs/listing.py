"""What a runs directory holds: one record per run (`dlrun runs`) and the config differences of
two runs (`dlrun runs --diff`).

Run directories are read as they are: a run still training, one that was interrupted, failed or
killed, one whose files are missing or damaged each get the record its files support, with a
note on what could not be read; reading never fails on a run's content.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..config.settings import TrainSettings
from ..config.source import parse_yaml
from ..errors import CheckpointError, DlrunError, UsageError
from ..registry.options import did_you_mean
from . import checkpoint, rundir

FINISHED, STOPPED_EARLY, INTERRUPTED, FAILED, RUNNING = "finished", "stopped early", "interrupted", "failed", "running"
UNREADABLE = "unreadable"  # a run directory the operating system does not let dlrun read
RUN_FILES = ("config.yaml", "metrics.csv", "summary.json", "checkpoints")  # a folder with none is no run


@dataclass
class RunRecord:
    """One run directory as `dlrun runs` shows it; None where the files do not say."""

    path: Path
    status: str
    config: str | None = None         # the config file the run was started from
    started: str | None = None        # YYYYmmdd-HHMMSS, from the directory's name
    epochs: int | None = None         # epochs recorded in metrics.csv
    planned: int | None = None        # train.epochs
    seconds: float | None = None      # training time
    monitor: str | None = None        # the metric best.npz follows
    best: float | None = None
    best_epoch: int | None = None
    final: float | None = None        # the monitored metric's last recorded value
    notes: list[str] = field(default_factory=list)  # what could not be read

    @property
    def name(self) -> str:
        return self.path.name


COLUMNS = ("run", "config", "status", "epochs", "time", "monitor", "best", "final", "started")


def sort_key(column: str):
    """The sort key of column ``column`` (a UsageError with did-you-mean for another name): values
    ascending, runs without one last."""
    keys = {"run": lambda r: r.name, "config": lambda r: r.config, "status": lambda r: r.status,
            "epochs": lambda r: r.epochs, "time": lambda r: r.seconds, "monitor": lambda r: r.monitor,
            "best": lambda r: r.best, "final": lambda r: r.final, "started": lambda r: r.started or ""}
    if column not in keys:
        raise UsageError(f"--sort {column}: unknown column{did_you_mean(column, COLUMNS)}; "
                         f"columns: {', '.join(COLUMNS)}")
    get = keys[column]
    return lambda r: (get(r) is None, get(r) if get(r) is not None else 0, r.name)


def list_runs(runs_dir: str | Path, sort: str = "started", reverse: bool = False) -> list[RunRecord]:
    """A record for each run directory in ``runs_dir`` (or for ``runs_dir`` itself when it is
    one), sorted by column ``sort``."""
    runs_dir = Path(runs_dir)
    key = sort_key(sort)
    if not runs_dir.is_dir():
        raise UsageError(f"{runs_dir}: no such directory (expected a runs directory such as runs/, where "
                         f"dlrun train writes its run directories)")
    if _is_run(runs_dir):
        folders = [runs_dir]
    else:
        try:
            folders = [p for p in runs_dir.iterdir() if p.is_dir() and _is_run(p)]
        except OSError as e:
            raise UsageError(f"{runs_dir}: cannot list it: {e.strerror or e}") from None
    records = [_read(p) for p in folders]
    records.sort(key=key, reverse=reverse)
    if reverse:  # runs without a value stay last
        records.sort(key=lambda r: key(r)[0])
    return records


def _read(run_dir: Path) -> RunRecord:
    try:
        return read_run(run_dir)
    except OSError as e:  # (permissions): the run is listed, with why it could not be read
        return RunRecord(run_dir, UNREADABLE, notes=[f"cannot read it: {e.strerror or e}"])


def _is_run(p: Path) -> bool:
    try:
        return any((p / name).exists() for name in RUN_FILES)
    except OSError:
        return False


def read_run(run_dir: Path) -> RunRecord:
    """The record of one run directory (never raises for what is in it)."""
    rec = RunRecord(run_dir, FAILED)
    rec.started = rundir.run_name(run_dir)[1]
    config = _yaml(run_dir / "config.resolved.yaml", rec, missing_ok=True) or _yaml(run_dir / "config.yaml", rec)
    train = config.get("train") if isinstance(config, dict) else None
    epochs = (train or {}).get("epochs", TrainSettings.epochs) if isinstance(config, dict) and \
        isinstance(train, (dict, type(None))) else None
    rec.planned = epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None
    info = _json(run_dir / "run.json", rec, missing_ok=True)
    rec.config = info.get("config") if isinstance(info.get("config"), str) else None
    rows = _metrics(run_dir / "metrics.csv", rec)
    rec.epochs = max((int(r["epoch"]) for r in rows), default=0) if rows or (run_dir / "metrics.csv").exists() else None
    summary = _json(run_dir / "summary.json", rec, missing_ok=True)
    last = run_dir / "checkpoints" / "last.npz"
    meta = {}
    if last.is_file():
        try:
            meta = checkpoint.read_meta(last)
        except CheckpointError:
            rec.notes.append("checkpoints/last.npz unreadable")
    # a summary older than the last rows or an interrupted checkpoint belongs to an earlier ending (before a resume)
    current = bool(summary) and isinstance(summary.get("epochs"), int) and summary["epochs"] >= (rec.epochs or 0) \
        and not (meta.get("interrupted") and _newer(last, run_dir / "summary.json"))
    owner = rundir.in_use(run_dir)
    if owner is not None:
        rec.status = RUNNING
    elif current:
        rec.status = STOPPED_EARLY if rec.planned is not None and summary["epochs"] < rec.planned else FINISHED
    elif meta.get("interrupted"):
        rec.status = INTERRUPTED
    else:  # it ended without its summary: an error, or the process was killed
        rec.status = FAILED
    seconds = summary.get("seconds") if current else None
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        seconds = sum(_number(r.get("seconds")) or 0.0 for r in rows) if rows else None
    rec.seconds = seconds
    best = summary.get("best") if current else None
    best = best if isinstance(best, dict) else meta.get("best") if isinstance(meta.get("best"), dict) else None
    if best is not None:
        rec.monitor = best.get("monitor") if isinstance(best.get("monitor"), str) else None
        rec.best = _number(best.get("value"))
        rec.best_epoch = best.get("epoch") if isinstance(best.get("epoch"), int) else None
    if rec.monitor is not None and rows:
        rec.final = next((v for v in (_number(r.get(rec.monitor)) for r in reversed(rows)) if v is not None), None)
    return rec


def _newer(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_mtime > b.stat().st_mtime
    except OSError:
        return False


def _number(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _yaml(path: Path, rec: RunRecord, missing_ok: bool = False):
    try:
        return parse_yaml(path.read_text(), str(path))[0]
    except FileNotFoundError:
        if not missing_ok:
            rec.notes.append(f"no {path.name}")
    except (OSError, UnicodeDecodeError, DlrunError):
        rec.notes.append(f"{path.name} unreadable")
    return None


def _json(path: Path, rec: RunRecord, missing_ok: bool = False) -> dict:
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            return data
    except FileNotFoundError:
        if not missing_ok:
            rec.notes.append(f"no {path.name}")
        return {}
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    rec.notes.append(f"{path.name} unreadable")
    return {}


def _metrics(path: Path, rec: RunRecord) -> list[dict]:
    """metrics.csv's complete rows (a row being written, or damaged, is left out)."""
    try:
        with open(path, newline="") as f:
            return [r for r in csv.DictReader(f)
                    if (r.get("epoch") or "").isdigit() and None not in r and None not in r.values()]
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, csv.Error):
        rec.notes.append("metrics.csv unreadable")
        return []


def find_run(target: str | Path, runs_dir: str | Path) -> Path:
    """The run directory ``target`` names: a path, or a run's name inside ``runs_dir``."""
    for p in (Path(target), Path(runs_dir) / str(target)):
        if p.is_dir() and _is_run(p):
            return p
    names = [p.name for p in Path(runs_dir).iterdir() if p.is_dir()] if Path(runs_dir).is_dir() else []
    raise UsageError(f"{target}: not a run directory{did_you_mean(str(target), names)} (give a run directory, or the "
                     f"name of one in {runs_dir})")


def config_diff(a: str | Path, b: str | Path, runs_dir: str | Path = "runs") -> tuple[Path, Path, list]:
    """The runs ``a`` and ``b`` name and the differences of their resolved configs: (key path,
    value in a, value in b), MISSING where a run's config has no such key."""
    paths = find_run(a, runs_dir), find_run(b, runs_dir)
    configs = []
    for p in paths:
        for name in rundir.CONFIG_FILES[::-1]:  # the resolved config; a run written before it, its config.yaml
            try:
                configs.append(parse_yaml((p / name).read_text(), str(p / name))[0])
                break
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"{p / name}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
        else:
            raise UsageError(f"{p}: no config.yaml or config.resolved.yaml; it records no config to compare")
    left, right = (dict(_leaves(c)) for c in configs)
    keys = list(left)  # b's keys that a lacks go after the key b has before them (model[3] after model[2])
    prev = None
    for k in right:
        if k not in left:
            keys.insert(keys.index(prev) + 1 if prev is not None else 0, k)
        prev = k
    return paths[0], paths[1], [(k, left.get(k, MISSING), right.get(k, MISSING)) for k in keys
                                if left.get(k, MISSING) != right.get(k, MISSING)]


MISSING = type("Missing", (), {"__repr__": lambda self: "(absent)"})()  # a key one config does not have


def _leaves(value, path: str = ""):
    """(key path, value) for every scalar (and empty mapping or list) in a parsed config."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else None
    if not items:
        yield path, value
        return
    for k, v in items:
        yield from _leaves(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k))
