"""Gradient accumulation: one optimizer step per window of k batches (``train.accumulate_batches``).

The step's gradient is the mean of its batches' gradients weighted by their sizes,
Σ_b (n_b / N)·g_b with N = Σ_b n_b: exactly the gradient of the mean loss over the window's N
samples, a batch k times larger (layers whose forward depends on the batch, such as BatchNorm,
still see each batch alone). Windows are counted from the epoch's first batch; the epoch's last
window may hold fewer batches and steps with those. After each batch but a window's last the
weighted gradient is added into a sum (one array for the model's flat gradient buffer); the last
batch's weighted gradient gets the sum added, and regularization, clipping and the step follow as
for any batch. Everything is in place: no allocation per batch, nothing read back on GPU.
"""
from __future__ import annotations


def window_end(batch: int, every: int, batches: int) -> int:
    """The batch index after the window holding ``batch``: windows end at multiples of ``every``
    (or the epoch's end)."""
    return min(batch - batch % every + every, batches)


def windows(batches: int, bs: int, used: int, every: int, start: int = 0) -> list[tuple[float, bool, bool]]:
    """``(share, first, last)`` for batches ``start``..``batches``−1 of an epoch of ``used``
    samples in batches of ``bs`` (the last one holding what is left). ``start``: the batches done
    when a resumed epoch continues; its window counts from there."""
    size = [bs] * batches
    if batches:
        size[-1] = used - (batches - 1) * bs
    plan = []
    b = start
    while b < batches:
        end = window_end(b, every, batches)
        total = sum(size[b:end])
        plan += [(size[j] / total, j == b, j == end - 1) for j in range(b, end)]
        b = end
    return plan


class GradAccumulator:
    """The running sum of a window's weighted gradients, for every trainable parameter."""

    def __init__(self, model):
        self.arena = model.arena
        packed = set() if self.arena is None else {id(p) for p in self.arena.params}
        self.loose = [p for _, p in model.named_parameters() if p.trainable and id(p) not in packed]
        self._sums = None

    def _grads(self) -> list:
        if self.arena is not None:
            self.arena.adopt()  # a layer that rebound a gradient: back into the flat buffer
        return ([self.arena.grad] if self.arena is not None else []) + [p.grad for p in self.loose]

    def add(self, share: float, first: bool) -> None:
        """After a batch that does not end its window: sum += share·grad."""
        grads = self._grads()
        if self._sums is None:  # once per trainer: the buffers' shapes never change
            self._sums = [g.copy() for g in grads]
        for s, g in zip(self._sums, grads):
            g *= share  # a Python float keeps float32 float32
            if first:
                s[...] = g
            else:
                s += g

    def finish(self, share: float, first: bool) -> None:
        """The window's last batch: grad = share·grad + sum (a window of one batch: grad as it is)."""
        if first:
            return
        for g, s in zip(self._grads(), self._sums):
            g *= share
            g += s
