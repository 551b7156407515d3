"""The exceptions dlrun raises; the CLI turns each into one line and an exit code."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where a value came from: a YAML file and line, or a command-line flag."""

    source: str | None = None  # "configs/x.yaml" or "--set"
    line: int | None = None
    path: str | None = None  # key path such as "model[2].units"

    def __str__(self) -> str:
        head = self.source or ""
        if self.line is not None:
            head = f"{head}:{self.line}"
        parts = [p for p in (head, self.path) if p]
        return ": ".join(parts)


class DlrunError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, where: Location | None = None):
        super().__init__(message)
        self.message = message
        self.where = where

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where and str(self.where) else self.message


class UsageError(DlrunError):
    """Bad usage, config or input: the user can fix it. Exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A config value is wrong."""


class ShapeError(ConfigError):
    """A layer cannot take the shape its predecessor produces."""


class DataError(UsageError):
    """A data file or generator produced unusable data."""


class BackendError(UsageError):
    """The requested device cannot be used."""


class PluginError(UsageError):
    """A plugin file could not be loaded."""


class ContractError(UsageError):
    """A component (a plugin's loss, optimizer, schedule, ...) returned something its contract
    rules out: checked on its first call, or on every value where that costs nothing."""


class LayerContractError(ContractError):
    """A layer's forward or backward returned an array of another shape, dtype or device than
    the model declared (checked on a model's first forward and backward)."""


class CheckpointError(UsageError):
    """A checkpoint is missing, corrupt, or does not fit the model."""


class ConfigErrors(ConfigError):
    """Several config problems, reported together."""

    def __init__(self, errors: list[DlrunError]):
        self.errors = sorted(errors, key=_order)
        super().__init__("; ".join(str(e) for e in self.errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def _order(e: DlrunError) -> tuple:
    """Sort key: the file's problems by line, then command-line flags, then the rest."""
    w = e.where
    if w is None or w.source is None:
        return (2, 0)
    if w.source.startswith("--"):
        return (1, 0)
    return (0, w.line or 0)


class TrainingError(DlrunError):
    """Training started but could not finish (non-finite loss, I/O failure). Exit code 1."""


class LayerError(TrainingError):
    """A layer's forward or backward raised (usually a plugin's own code): the message names the
    layer, the call and the file:line in the layer's source. Exit code 1."""


class PluginRaised(TrainingError):
    """A plugin's own code raised (a loss, optimizer, schedule, regularizer, data generator, ...):
    the message names the component, the method and the file:line in the plugin. Exit code 1."""


class NonFiniteError(TrainingError):
    """A loss, activation, gradient or weight became NaN or inf; ``where`` names the first one."""

    def __init__(self, message: str, epoch: int, batch: int | None, where: str | None):
        super().__init__(message)
        self.epoch, self.batch, self.where_found = epoch, batch, where


class Interrupted(DlrunError):
    """SIGINT or SIGTERM stopped training; exit code 128 + the signal number (130, 143)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
        self.immediate = False  # True for a second signal: nothing was saved


def collect(errors: list[DlrunError]) -> None:
    """Raise the errors gathered so far: one as itself, several as ConfigErrors."""
    flat: list[DlrunError] = []
    for e in errors:
        flat.extend(e.errors if isinstance(e, ConfigErrors) else [e])
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise ConfigErrors(flat)
