"""The files of a run directory: its name, config.yaml, metrics.csv and summary.json.

Layout of ``RUNS_DIR/<name>-<YYYYmmdd-HHMMSS>/`` (checkpoints are :mod:`dlrun.runs.snapshot`'s):

* ``config.yaml``  — the config as written (file and ``--set``), with the seed actually used;
* ``config.resolved.yaml`` — the same with every default applied (:mod:`dlrun.config.resolved`);
* ``metrics.csv``  — one row per epoch, appended as training goes;
* ``summary.json`` — final metrics, epochs, seconds, the best epoch;
* ``run.json``     — how the run was started: the config file and its ``--set`` items;
* ``.lock``        — held by the process training in it (:class:`RunLock`).
"""
from __future__ import annotations

import csv
import errno
import json
import os
import re
from datetime import datetime
from pathlib import Path

from ..config import Config
from ..config.resolved import BLOCK, resolved
from ..config.source import dump_yaml
from ..errors import TrainingError, UsageError
from ..training.hooks import Callback

METRIC_COLUMNS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "learning_rate", "seconds")


def metric_columns(metrics: tuple[str, ...] = ()) -> tuple[str, ...]:
    """metrics.csv's columns: METRIC_COLUMNS with train_NAME and val_NAME for each metric of
    train.metrics after val_accuracy."""
    extra = tuple(f"{p}_{n}" for n in metrics for p in ("train", "val"))
    return METRIC_COLUMNS[:5] + extra + METRIC_COLUMNS[5:]


# errors of the machine, not of the path given: the run failed (exit 1); any other is a usage error
FAULTS = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.ENOMEM}


def new_run_dir(runs_dir: str | Path, name: str) -> Path:
    """Create ``runs_dir/<name>-<timestamp>``; never reuse an existing folder."""
    runs_dir = Path(runs_dir)
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in FAULTS:  # a full disk, an I/O error: the run failed
            raise TrainingError(f"cannot create the runs directory {runs_dir}: {e.strerror}") from None
        why = {errno.EACCES: "choose a writable place", errno.EPERM: "choose a writable place",
               errno.EROFS: "choose a writable place", errno.ENAMETOOLONG: "give a shorter path"}.get(
            e.errno, "a file is in the way; give a directory" if isinstance(e, (FileExistsError, NotADirectoryError))
            else "give a directory that can be created")
        raise UsageError(f"--runs-dir {runs_dir}: cannot create the runs directory: {e.strerror} ({why})") from None
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = runs_dir / (f"{name}-{stamp}" + (f"-{i + 1}" if i else ""))
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise TrainingError(f"cannot create a run directory in {runs_dir}: {e.strerror}") from None
    raise TrainingError(f"too many runs named {name}-{stamp} in {runs_dir}")


STAMP = re.compile(r"^(.+)-(\d{8}-\d{6})(?:-\d+)?$")  # what new_run_dir names: NAME-YYYYmmdd-HHMMSS[-N]


def run_name(run_dir: Path) -> tuple[str, str | None]:
    """(the run's name, its start YYYYmmdd-HHMMSS) from its directory's name: ``spiral-20260101-120000``
    is ``("spiral", "20260101-120000")``; a folder named otherwise is its name with no time."""
    m = STAMP.match(Path(run_dir).name)
    return (m.group(1), m.group(2)) if m else (Path(run_dir).name, None)


def discard_if_empty(run_dir: Path) -> None:
    """Remove a new run's directory when it failed before finishing an epoch: it would hold only
    config.yaml and a metrics header, nothing to resume, evaluate, predict from or read. Called
    while another error propagates, so it never raises."""
    ckpts = run_dir / "checkpoints"
    try:
        if ckpts.is_dir() and any(ckpts.iterdir()):
            return
        metrics = run_dir / "metrics.csv"
        if metrics.is_file():
            with open(metrics) as f:
                if sum(1 for _ in f) > 1:  # an epoch's metrics were recorded: keep them
                    return
        for name in (*CONFIG_FILES, RUN_INFO, "metrics.csv", LOCK):
            (run_dir / name).unlink(missing_ok=True)
        for p in run_dir.glob("events.out.tfevents.*"):  # (the tensorboard logger's: no epoch in them)
            p.unlink()
        if ckpts.is_dir():
            ckpts.rmdir()
        run_dir.rmdir()  # only if nothing else is there
    except OSError:
        pass


LOCK = ".lock"


def in_use(run_dir: Path) -> int | None:
    """The process id training in ``run_dir`` (holding its :class:`RunLock`), or None. (Testing
    the lock takes it for an instant when it is free.)"""
    try:
        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        _lock(fd)
        return None
    except OSError:
        owner = os.read(fd, 32).decode(errors="replace").strip()
        return int(owner) if owner.isdigit() else -1
    finally:
        os.close(fd)


class RunLock:
    """Exclusive use of a run directory by the one process training in it (``with RunLock(d):``).

    The lock is the operating system's lock on ``RUN/.lock`` (``flock``; ``msvcrt.locking`` on
    Windows), which the system releases when its process ends, however it ends: a run left by a
    killed process is never blocked. The file holds the owner's process id, for the refusal."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def __enter__(self) -> "RunLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise TrainingError(f"cannot write {self.path}: {e.strerror or e}") from None
        try:
            _lock(fd)
        except OSError:
            owner = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise UsageError(f"{self.path.parent} is in use by process {owner or '(unknown)'}, which is training "
                             f"in it; wait for it to finish or stop it (Ctrl-C), then try again") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (releases the lock; the file stays, so no two processes lock two files)
            self.fd = None


try:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except ImportError:  # pragma: no cover  (Windows)
    import msvcrt

    def _lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)


# what a write killed before its rename leaves: checkpoints' .NAME.npz.tmp-PID, and .NAME.tmp
_TEMPORARY = re.compile(r"^\..+\.(npz\.tmp-\d+|tmp)$")


def remove_temporary_files(run_dir: Path) -> list[Path]:
    """Delete the temporary files that writes killed mid-way (SIGKILL, power loss) left in the
    run directory and its checkpoints folder; call with the :class:`RunLock` held, so that none
    belongs to a live writer. Returns what was removed."""
    removed = []
    for folder in (run_dir, run_dir / "checkpoints"):
        try:
            names = [p for p in folder.iterdir() if _TEMPORARY.match(p.name) and p.is_file()]
        except OSError:
            continue
        for p in names:
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


class MetricsWriter(Callback):
    """Writes metrics.csv (a row per epoch, flushed) into the run directory."""

    def __init__(self, run_dir: Path, metrics: tuple[str, ...] = ()):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.csv"
        self.columns = metric_columns(metrics)

    def on_train_begin(self, trainer):
        try:  # a resumed run appends under the header the file has (truncate_metrics wrote it)
            with open(self.path, newline="") as f:
                self.columns = next(csv.reader(f), None) or self.columns
        except OSError:
            pass

    def on_epoch_end(self, epoch, metrics):
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(self.columns)
            w.writerow(["" if metrics.get(c) is None else metrics[c] for c in self.columns])


CONFIG_FILES = ("config.yaml", "config.resolved.yaml")  # as written, and every default applied
RUN_INFO = "run.json"


def write_run_info(run_dir: Path, config: Config) -> None:
    """Write run.json: the config file a new run was started from and its --set items."""
    file = config.source.file
    overrides = [f.removeprefix("--set ") for f in dict.fromkeys(config.source.flags.values()) if f.startswith("--set ")]
    try:
        (run_dir / RUN_INFO).write_text(json.dumps({"config": os.path.abspath(file) if file else None,
                                                    "set": overrides}, indent=2) + "\n")
    except OSError as e:
        raise TrainingError(f"cannot write {run_dir / RUN_INFO}: {e.strerror or e}") from None


def write_config(run_dir: Path, config: Config) -> dict[Path, bytes | None]:
    """Write the run's config.yaml and config.resolved.yaml; return the bytes each replaced (None:
    there was none, or it could not be read), for :func:`put_back`."""
    texts = dict(zip(CONFIG_FILES, (dump_yaml(config.raw), dump_yaml(resolved(config), BLOCK))))
    old = {}
    for name, text in texts.items():
        path = run_dir / name
        try:
            old[path] = path.read_bytes()
        except OSError:
            old[path] = None
        try:
            path.write_text(text)
        except OSError as e:
            raise TrainingError(f"cannot write {path}: {e.strerror or e}") from None
    return old


def put_back(files: dict[Path, bytes | None]) -> None:
    """Restore files' earlier bytes (what write_config returned), as far as the disk allows: it
    runs while another error is being reported, which must not be replaced by this one."""
    for path, data in files.items():
        if data is not None:
            try:
                path.write_bytes(data)
            except OSError:
                pass


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def truncate_metrics(path: Path, epoch: int, metrics: tuple[str, ...] = ()) -> None:
    """Drop metrics rows after ``epoch`` (written after the last checkpoint) before appending, and
    give the file the columns of ``metrics`` (train.metrics may change on resume): a column no
    longer recorded keeps its values, one not recorded before is empty in the earlier rows."""
    if not path.is_file():
        return
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header = rows[0]
    wanted = metric_columns(metrics)
    columns = list(wanted) + [c for c in header if c not in wanted]
    keep = [dict(zip(header, r)) for r in rows[1:] if r and r[0].isdigit() and int(r[0]) <= epoch]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows([r.get(c, "") for c in columns] for r in keep)
    os.replace(tmp, path)


def last_row(path: Path, epoch: int) -> dict:
    """metrics.csv's row of ``epoch`` as numbers (None for empty cells); {} when it has none."""
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("epoch", "").isdigit() and int(r["epoch"]) == epoch]
    except OSError:
        return {}
    if not rows:
        return {}
    out = {}
    for k, v in rows[-1].items():
        try:
            out[k] = float(v) if v not in ("", None) else None
        except ValueError:
            out[k] = None
    return out


def previous_seconds(run_dir: Path, epochs: int, partial: float = 0.0) -> float:
    """Training seconds a resumed run already spent: the ``seconds`` of its first ``epochs`` rows
    of metrics.csv, plus ``partial``, those of the batches done in an interrupted epoch. (An
    interrupted run has no summary.json to read them from; 0 for rows it cannot read.)"""
    total = partial
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):
                try:
                    if int(row["epoch"]) <= epochs:
                        total += float(row["seconds"])
                except (KeyError, TypeError, ValueError):
                    continue
    except OSError:
        pass
    return total
