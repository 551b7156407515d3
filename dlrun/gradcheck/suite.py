"""`dlrun gradcheck --all`: every registered layer, loss and regularizer (built-ins and plugins)."""
from __future__ import annotations

from .. import registry
from ..errors import DlrunError
from . import device as devices
from .losscheck import check_loss
from .regcheck import check_regularizer
from .report import LayerReport
from .runner import check_layer
from .settings import Settings


def check_all(settings: Settings | None = None, names=None, losses: bool = True, on_start=None) -> list[LayerReport]:
    """One report per layer (``names``, default all), then per loss and regularizer unless
    ``losses`` is False; one that cannot be built is reported as an ERROR, not raised.
    ``on_start(name, i, total)`` is called before each check (the CLI's progress line)."""
    settings = (settings or Settings()).resolved()
    devices.open_device(settings.device)  # an unusable device is one error, not one per check
    jobs = [(n, check_layer, "from its input_spec") for n in names or registry.layers.names()]
    if losses:
        jobs += [(n, check_loss, "with its default options") for n in registry.losses.names()]
        jobs += [(n, check_regularizer, "with its default options") for n in registry.regularizers.names()]
    reports = []
    for i, (name, check, how) in enumerate(jobs):
        if on_start is not None:
            on_start(name, i + 1, len(jobs))
        try:
            reports.append(check(name, None, settings))
        except DlrunError as e:
            reports.append(LayerReport(name, {}, error=f"cannot build {how}: {e}"))
    return reports
