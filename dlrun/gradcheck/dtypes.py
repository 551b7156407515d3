"""The float32 aux check of a float64 gradient check: training runs in float32 by default, so a
layer whose backward promotes to float64 (``2 * (x > 0) * x * dy``: a bool times a Python int is
int64, which turns float32 into float64) passes in float64 and is refused by ``dlrun train``.
One forward and backward of a fresh float32 instance shows it at once."""
from __future__ import annotations

import numpy as np

from . import inputs


def float32_problem(name: str, options: dict, spec, dims, shape, n: int, dev, seed: int) -> str | None:
    """What a float32 forward/backward of the layer returns in another dtype, or None."""
    layer = inputs.build_layer(name, inputs.layer_options(spec, dims, options), name)
    layer.setup(dev.backend, np.float32, np.random.default_rng(seed), seed)
    out_shape = tuple(layer.build(shape))
    rng = np.random.default_rng(seed)
    high = inputs.index_high(spec, dims, layer) if spec.kind == "index" else None
    x = dev.put(inputs.draw_x(spec, (n, *shape), high, np.float32, rng))
    y = dev.put(inputs.labels(n, inputs.label_count(spec, dims, out_shape, layer), rng)) if layer.needs_labels else None
    try:
        out = layer.forward(x, y) if layer.needs_labels else layer.forward(x)
        dx = layer.backward(dev.put(rng.standard_normal(out.shape).astype(np.float32)))
    except Exception as e:  # the float64 check ran the same code: this is float32's own failure
        return f"in float32 the layer raised {type(e).__name__}: {e}"
    wrong = [f"{what} {a.dtype}" for what, a in (("output", out), ("dx", dx)) if _off(a, x if what == "dx" else None)]
    wrong += [f"{n}.grad {p.grad.dtype}" for n, p in layer.params.items()
              if p.trainable and p.grad is not None and p.grad.dtype != np.float32]
    if not wrong:
        return None
    return (f"with float32 inputs and parameters (training's default) it returns {', '.join(wrong)}: dlrun train "
            f"refuses that; keep the dtype (float64 comes from a Python scalar times a bool or int array, "
            f"np.float64(c) or np.array([c]) constants, float64 scratch arrays: write x.dtype.type(c), "
            f"dy.astype(x.dtype), np.zeros(shape, x.dtype))")


def _off(a, x) -> bool:
    """An array that should be float32 and is not (dx of integer inputs follows them)."""
    if a is None or not hasattr(a, "dtype"):
        return False
    if x is not None and x.dtype.kind != "f":
        return False
    return a.dtype != np.float32
