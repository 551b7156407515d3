"""`dlrun gradcheck`: check hand-written backward passes against central finite differences.

``check_layer(name)`` checks one registered layer on inputs generated from its ``input_spec``;
``check_loss(name)`` one registered loss on random scores and targets; ``check_regularizer(name)``
one regularizer's add_gradient against its penalty; ``check_all()`` every registered layer, loss
and regularizer; ``check_config(path)`` a whole model plus its loss and then each of
its layers. All return :class:`LayerReport` records; the CLI prints.
"""
from .report import ERROR, FAIL, PASS, AuxResult, LayerReport, TensorResult, Worst  # noqa: F401
from .runner import check_layer  # noqa: F401
from .losscheck import check_loss  # noqa: F401
from .regcheck import check_regularizer  # noqa: F401
from .settings import Settings  # noqa: F401
from .suite import check_all  # noqa: F401

from .model import check_config  # noqa: F401
