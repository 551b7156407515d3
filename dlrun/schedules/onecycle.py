"""onecycle: the one-cycle policy (Smith & Topin 2019), as PyTorch's OneCycleLR computes it."""
from __future__ import annotations

import math
from typing import Annotated, Literal

from ..registry.options import OptionError, PositiveFloat, Range
from ..registry import schedules
from .base import Schedule


@schedules.register("onecycle")
class OneCycle(Schedule):
    """lr rises from lr₀/div_factor to lr₀ over the first pct_start of the run, then anneals to lr₀/(div_factor·final_div_factor).

    The one-cycle policy of Smith & Topin (2019), with the rates of PyTorch's OneCycleLR for
    max_lr = lr₀ (the optimizer's learning_rate is the peak). Counted in steps as PyTorch counts
    them: over T steps (train.epochs × optimizer steps per epoch with ``schedule_interval:
    step``, the usual choice, a step being accumulate_batches batches; train.epochs per epoch), the rise ends at step pct_start·T − 1 and the last
    step, T − 1, takes the final rate. ``three_phase`` falls back to lr₀/div_factor by step
    2·pct_start·T − 2 before the final anneal. Only the learning rate cycles: momentum is
    left as configured (PyTorch also cycles it unless ``cycle_momentum=False``).

    Args:
        pct_start: the share of the run spent rising, in (0, 1).
        div_factor: lr₀ divided by the starting rate.
        final_div_factor: the starting rate divided by the final rate.
        anneal: cos (half a cosine within each phase) or linear.
        three_phase: rise, fall back to the starting rate, then anneal to the final rate.
    """

    def __init__(self, pct_start: Annotated[float, Range(0, 1, min_inclusive=False, max_inclusive=False)] = 0.3,
                 div_factor: PositiveFloat = 25.0, final_div_factor: PositiveFloat = 1e4,
                 anneal: Literal["cos", "linear"] = "cos", three_phase: bool = False):
        if three_phase and pct_start >= 0.5:
            raise OptionError(f"three_phase needs pct_start < 0.5 (the rise and the fall each take pct_start of the "
                              f"run), got {pct_start}", "pct_start")
        self.pct_start, self.div_factor, self.final_div_factor = pct_start, div_factor, final_div_factor
        self.anneal, self.three_phase = anneal, three_phase

    def at(self, u, delta):
        # in epochs: a step lasts delta, so PyTorch's step s is u = s·delta and its end steps
        # pct·T − 1 and T − 1 are pct·E − delta and E − delta
        peak = self.base_lr
        initial = peak / self.div_factor
        final = initial / self.final_div_factor
        rise_end = self.pct_start * self.epochs - delta
        phases = [(rise_end, initial, peak)]
        if self.three_phase:
            phases.append((2 * self.pct_start * self.epochs - 2 * delta, peak, initial))
            phases.append((self.epochs - delta, initial, final))
        else:
            phases.append((self.epochs - delta, peak, final))
        start = 0.0
        for k, (end, lo, hi) in enumerate(phases):
            if u <= end + 1e-9 or k == len(phases) - 1:
                pct = min(1.0, (u - start) / (end - start)) if end > start else 1.0
                if self.anneal == "linear":
                    return lo + (hi - lo) * pct
                return hi + (lo - hi) / 2.0 * (math.cos(math.pi * pct) + 1.0)
            start = end
        raise AssertionError("unreachable: the last phase always answers")
