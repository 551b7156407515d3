"""`dlrun gradcheck --device`: the checker keeps points, snapshots and comparisons on the host
and perturbs the arrays the checked code reads on its device.

Without a GPU this is tested with a device whose moves copy, as CuPy's do (the arrays stay
numpy): a checker that perturbed or compared a host copy instead of the device array would read
zero differences or miss in-place writes, and these tests would fail. tests/test_gpu.py runs
the same checks on CuPy where a CUDA device exists.
"""
from __future__ import annotations

import weakref

import numpy as np
import pytest

from dlrun.backend import CPU, gpu_available
from dlrun.errors import UsageError
from dlrun.gradcheck import FAIL, PASS, Settings, check_all, check_config, check_layer, device
from broken_layers import BUGS
from conftest import CONFIGS
from test_gradcheck_broken import registered


class Copying(device.Device):
    """Moves that copy, like host-to-GPU transfers; an array it made counts as on the device and
    is passed through, as ``cupy.asarray`` does. Counts the copies so a test sees they happen."""

    def __init__(self):
        super().__init__(CPU)
        self.puts = 0
        self.made: dict[int, weakref.ref] = {}

    def put(self, a):
        if a is None:
            return None
        ref = self.made.get(id(a))
        if ref is not None and ref() is a:
            return a
        self.puts += 1
        b = np.array(a, copy=True)
        self.made[id(b)] = weakref.ref(b)
        return b


@pytest.fixture
def copying(monkeypatch):
    dev = Copying()
    monkeypatch.setattr(device, "open_device", lambda name: dev)
    return dev


def test_every_layer_loss_and_regularizer_passes_through_copying_moves(copying):
    reports = check_all(Settings(device="gpu"))
    assert [r.layer for r in reports if r.verdict != PASS] == []
    assert len(reports) >= 33 and copying.puts > 4 * len(reports)  # several points per check
    assert all(r.settings.get("device") == "gpu" for r in reports)


def test_whole_config_and_fast_mode_through_copying_moves(copying):
    assert check_config(CONFIGS / "spiral.yaml", settings=Settings(device="gpu")).verdict == PASS
    for mode in ("fast", "sampled", "jacobian"):
        r = check_layer("Linear", settings=Settings(device="gpu", mode=mode, dims="N=2,D=3,C=2"))
        assert r.verdict == PASS, (mode, r.to_dict())


@pytest.mark.parametrize("cls", list(BUGS), ids=lambda c: c.__name__)
def test_planted_bugs_are_found_through_copying_moves(copying, cls):
    must_fail, must_pass = BUGS[cls]
    with registered(cls) as name:
        report = check_layer(name, settings=Settings(device="gpu"))
    failed = {t.name for t in report.tensors if t.status == FAIL} | {a.name for a in report.aux if a.status == FAIL}
    assert report.verdict == FAIL and must_fail <= failed and not (must_pass & failed), failed


def test_default_nondet_tol_is_zero_on_cpu_and_small_relative_on_gpu():
    assert Settings().resolved().nondet_tol == 0.0
    assert Settings(device="gpu").resolved().nondet_tol == 1e-12
    assert Settings(device="gpu", nondet_tol=0.0).resolved().nondet_tol == 0.0
    with pytest.raises(UsageError, match=r"--device must be one of cpu, gpu, got 'gpuu' \(did you mean gpu"):
        Settings(device="gpuu").resolved()


def test_tf32_warning_only_for_float32_on_gpu_with_cupy_tf32_set(monkeypatch):
    monkeypatch.setenv("CUPY_TF32", "1")
    assert device.warnings_for("gpu", "float32") == [device.TF32_WARNING]
    assert device.warnings_for("gpu", "float64") == [] and device.warnings_for("cpu", "float32") == []
    for off in ("0", "", "no"):
        monkeypatch.setenv("CUPY_TF32", off)
        assert device.warnings_for("gpu", "float32") == []


@pytest.mark.skipif(gpu_available(), reason="checks the message given where no GPU can be used")
def test_cli_device_gpu_without_a_gpu_is_one_clear_error(cli):
    for args in (("LargeMarginFC",), ("--all",), (str(CONFIGS / "spiral.yaml"),), ("Hinge",)):
        r = cli("gradcheck", *args, "--device", "gpu")
        assert r.code == 2 and r.out == "", (args, r.out)
        assert r.err.count("error:") == 1 and "device 'gpu'" in r.err and "--device cpu" in r.err, r.err
        assert "Traceback" not in r.err
    r = cli("gradcheck", "LargeMarginFC", "--device", "cuda")
    assert r.code == 2 and "--device must be one of cpu, gpu, got 'cuda'" in r.err
