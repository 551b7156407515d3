"""What the GPU tests cover, checked where there is no GPU too: these guards sat in test_gpu.py,
which skips as a whole without CUDA, so a new loss or optimizer without a GPU case went
unnoticed on CPU-only CI. (Every registered layer is compared by construction: test_gpu.VARIANTS
is built from the registry.)"""
from __future__ import annotations

from test_gpu import LOSS_CASES, OPTIMIZER_SPECS

from dlrun import registry


def test_every_loss_has_a_gpu_case():
    assert set(LOSS_CASES) == set(registry.losses.names())


def test_every_optimizer_has_a_gpu_case():
    assert {spec["type"] for spec in OPTIMIZER_SPECS} == set(registry.optimizers.names())
