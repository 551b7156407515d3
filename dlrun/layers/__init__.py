"""Built-in layers, one small module each (activations share one). Importing this package
registers them; ``Layer`` and ``Parameter`` are the contract user layers are written against."""
from .base import InputSpec, Layer, Parameter  # noqa: F401
from . import linear, activations, gelu  # noqa: F401  (registration side effects)
from . import (conv2d, maxpool2d, avgpool2d, globalavgpool2d, flatten, reshape,  # noqa: F401
               batchnorm, layernorm, dropout, embedding, simple_rnn, lstm, gru)
from . import large_margin, lsoftmax, requ, multiply, minmax, normalized_dense, merge, slicing  # noqa: F401
from . import attention, positional, sequence_pool  # noqa: F401
