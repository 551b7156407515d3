"""The ``tensorboard`` logger of ``train.loggers``: TensorBoard event files in the run directory.

Each epoch writes every metrics.csv column (train_loss, val_loss, train_accuracy, ...,
learning_rate, seconds) as a scalar at step = epoch, and flushes; with
``train.log_every_n_steps: N`` the training loss of every Nth optimizer step is written as
``step_loss`` at step = the optimizer step. The run's config, flattened (``optimizer.learning_rate``,
``model[0].units``, ...), is written as its hyper-parameters for TensorBoard's HParams tab.
``tensorboard --logdir runs`` then shows every run of a runs directory, named by its folder.

A resumed run first removes from the run's event files what was written after the state it
resumes from (epochs after the checkpoint's, steps after its step), as --resume does with
metrics.csv, so no step is recorded twice; then it writes a new event file beside them. The
events are written with tensorboardX (the ``tensorboard`` extra: ``pip install 'dlrun[tensorboard]'``).
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from ..config import Config
from ..errors import ConfigError
from ..training.hooks import Callback

STEP_TAG = "step_loss"
_PREFIX = "events.out.tfevents."


def _tensorboardx():
    """The tensorboardX modules the logger writes with; a one-line error when it is missing."""
    try:
        from tensorboardX import event_file_writer, record_writer, summary
        from tensorboardX.proto import event_pb2, summary_pb2
    except ImportError:
        raise ConfigError("train.loggers: tensorboard needs the tensorboardX package; install it with "
                          "pip install 'dlrun[tensorboard]' (or drop tensorboard from train.loggers)") from None
    return event_file_writer, record_writer, summary, event_pb2, summary_pb2


class TensorBoardLogger(Callback):
    """Writes TensorBoard event files into ``run_dir`` (see the module docstring).

    Args:
        config: the run's config (its hyper-parameters, and ``train.log_every_n_steps``).
        run_dir: the run directory the event files go into.
    """

    def __init__(self, config: Config, run_dir: Path | None = None):
        self.modules = _tensorboardx()  # (checked before the run directory is written)
        self.config = config
        self.run_dir = run_dir
        self.every = config.train.log_every_n_steps
        self.writer = None
        self.trainer = None
        self.logged_step = None

    def on_train_begin(self, trainer):
        event_file_writer, _, summary, event_pb2, _ = self.modules
        self.trainer = trainer
        prune(self.run_dir, trainer.epoch, trainer.step)
        # a file of its own for each session of the run (events files are never appended to),
        # numbered so that two within one second keep apart
        number = sum(1 for p in self.run_dir.iterdir() if p.name.startswith(_PREFIX)) + 1
        self.writer = event_file_writer.EventsWriter(str(self.run_dir / "events"), f".{number}")
        self.logged_step = trainer.step
        start = summary.hparams(hyperparameters(self.config.raw), {})[1]  # the session's start: its hparams
        self.writer.write_event(event_pb2.Event(summary=start, step=trainer.epoch))
        self.writer.flush()

    def on_batch_end(self, epoch, batch):
        step = self.trainer.step
        if self.every is None or step == self.logged_step or step % self.every:
            return
        self.logged_step = step
        total, size = self.trainer.batch_score
        self._write({STEP_TAG: float(total) / size}, step)  # (a read from the device every N steps)

    def on_epoch_end(self, epoch, metrics):
        self._write({k: v for k, v in metrics.items() if k != "epoch" and v is not None}, epoch)
        self.writer.flush()

    def on_train_end(self, history):
        _, _, summary, event_pb2, _ = self.modules
        end = summary.hparams({}, {})[2]  # the session ended (an interrupted one has no end)
        self.writer.write_event(event_pb2.Event(summary=end, step=self.trainer.epoch))
        self.close()

    def _write(self, values: dict, step: int) -> None:
        _, _, _, event_pb2, summary_pb2 = self.modules
        summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                                          for k, v in values.items()])
        self.writer.write_event(event_pb2.Event(summary=summ, step=step, wall_time=time.time()))

    def close(self) -> None:
        """Flush and close the event file (on every ending: a stop, an error, the end)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def hyperparameters(raw: dict) -> dict:
    """The config as TensorBoard hyper-parameters: one entry per value, named by its key path
    (``optimizer.learning_rate``, ``model[0].units``, ``loss``); lists of values as text."""
    out: dict = {}

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        elif isinstance(value, (bool, int, float, str)):
            out[path] = value
        elif value is not None:  # a list of plain values
            out[path] = str(value)

    walk(raw, "")
    return out


def _records(path: Path):
    """(offset, record bytes) of each whole record of a TFRecord file; stops at a record cut
    short or damaged (a write killed mid-way)."""
    _, record_writer, _, _, _ = _tensorboardx()
    data = path.read_bytes()
    at = 0
    while at + 12 <= len(data):
        header = data[at:at + 8]
        (n,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        end = at + 12 + n + 4
        if crc != record_writer.masked_crc32c(header) or end > len(data):
            return
        body = data[at + 12:at + 12 + n]
        if struct.unpack("<I", data[end - 4:end])[0] != record_writer.masked_crc32c(body):
            return
        yield at, data[at:end]
        at = end


def event_files(run_dir: Path) -> list[Path]:
    """The run directory's TensorBoard event files, oldest first."""
    return sorted((p for p in Path(run_dir).iterdir() if p.name.startswith(_PREFIX) and p.is_file()),
                  key=lambda p: (p.stat().st_mtime, p.name))


def prune(run_dir: Path, epoch: int, step: int) -> None:
    """Remove from the run's event files the scalars recorded after ``epoch`` (the per-step loss:
    after optimizer step ``step``), and a record cut short at a file's end; each file changed is
    replaced whole (a file is never left half-written)."""
    _, _, _, event_pb2, _ = _tensorboardx()
    for path in event_files(run_dir):
        kept, changed = [], False
        size = path.stat().st_size
        end = 0
        for at, record in _records(path):
            end = at + len(record)
            event = event_pb2.Event.FromString(record[12:-4])
            if event.HasField("summary") and event.summary.value:
                tags = {v.tag for v in event.summary.value}
                bound = step if tags == {STEP_TAG} else epoch
                if event.step > bound:
                    changed = True
                    continue
            kept.append(record)
        if not changed and end == size:
            continue
        tmp = path.with_name(f".events-rewrite-{os.getpid()}.tmp")  # (no 'tfevents': TensorBoard skips it)
        try:
            tmp.write_bytes(b"".join(kept))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
