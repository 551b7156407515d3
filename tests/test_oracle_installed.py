"""CI must run the comparisons with PyTorch: README's test command installs its CPU build (the
``bench`` extra), and without it every oracle test would skip and CI would still pass."""
from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="only CI promises the oracle (README's test command)")
def test_ci_has_the_pytorch_oracle():
    assert importlib.util.find_spec("torch") is not None, (
        "torch is not installed: the comparison tests would all skip; install the bench extra as README says")
