"""`dlrun gradcheck --all`: every registered layer, loss and regularizer (built-ins and plugins)."""
from __future__ import annotations

from .. import registry
from ..errors import DlrunError
from .losscheck import check_loss
from .regcheck import check_regularizer
from .report import LayerReport
from .runner import check_layer
from .settings import Settings


def check_all(settings: Settings | None = None, names=None, losses: bool = True) -> list[LayerReport]:
    """One report per layer (``names``, default all), then per loss and regularizer unless
    ``losses`` is False; one that cannot be built is reported as an ERROR, not raised."""
    settings = (settings or Settings()).resolved()
    reports = []
    for name in names or registry.layers.names():
        try:
            reports.append(check_layer(name, None, settings))
        except DlrunError as e:
            reports.append(LayerReport(name, {}, error=f"cannot build from its input_spec: {e}"))
    for name in registry.losses.names() if losses else ():
        try:
            reports.append(check_loss(name, None, settings))
        except DlrunError as e:
            reports.append(LayerReport(name, {}, error=f"cannot build with its default options: {e}"))
    for name in registry.regularizers.names() if losses else ():
        try:
            reports.append(check_regularizer(name, None, settings))
        except DlrunError as e:
            reports.append(LayerReport(name, {}, error=f"cannot build with its default options: {e}"))
    return reports
