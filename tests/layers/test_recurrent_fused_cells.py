"""The recurrent layers' GPU paths: each time step is its recurrent product and one fused cell
kernel (dlrun_lstm_step, dlrun_gru_step, dlrun_rnn_step and their _grad), forward and backward;
and a layer of up to ``SEQUENCE_UNITS`` units (its module's) runs the whole sequence in one kernel each
way (dlrun_lstm_sequence and its _grad), the recurrent product summed inside it, and so do the
GRU and SimpleRNN (dlrun_gru_sequence, dlrun_rnn_sequence).

Without a GPU the kernels run their numpy emulators (tests/kernel_emulation.py), and the GPU path
must equal the CPU path to rounding in float64 and float32, over two batch sizes in a row, give
PyTorch's outputs and gradients, and pass float64 central differences. The ``gpu`` tests at the
end run the CUDA kernels against the CPU at the size of configs/adding_lstm.yaml (and the
sequence kernels at their limit of units). That no step reads from the device is
tests/backend/test_gpu_step_host_reads.py's (its recurrent case).
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU, BLOCK_KERNELS, KERNELS as DECLARED, Kernel, get_backend, gpu_available, to_host
from dlrun.layers import gru, lstm, simple_rnn
from dlrun.model import Sequential
from kernel_emulation import emulate
from layer_numgrad import check_gradients, make
from torch_recurrent import assert_weight_gradients_equal, outputs_and_input_gradient, twin

KERNELS = {"LSTM": "dlrun_lstm_step", "GRU": "dlrun_gru_step", "SimpleRNN": "dlrun_rnn_step"}
SEQUENCE = {"LSTM": "dlrun_lstm_sequence", "GRU": "dlrun_gru_sequence", "SimpleRNN": "dlrun_rnn_sequence"}
MODULES = {"LSTM": lstm, "GRU": gru, "SimpleRNN": simple_rnn}  # each holds its SEQUENCE_UNITS


def _per_step(monkeypatch):
    for module in MODULES.values():
        monkeypatch.setattr(module, "SEQUENCE_UNITS", 0)


@pytest.fixture
def per_step(monkeypatch):
    """The layers take their per-step cells at every size, as above their ``SEQUENCE_UNITS``."""
    _per_step(monkeypatch)
# every layer with and without its sequence output, and the GRU without biases (no b_u to add)
CASES = [(name, {"return_sequences": rs}) for name in KERNELS for rs in (False, True)] + [
    ("GRU", {"use_bias": False}), ("LSTM", {"unit_forget_bias": False, "return_sequences": True})]
IDS = [n + "".join(f"-{k}={v}" for k, v in o.items()) for n, o in CASES]
STEPS, FEATURES, UNITS = 7, 3, 6


def _spec(name, options):
    bias = {"bias_initializer": {"type": "normal", "std": 0.3}} if options.get("use_bias", True) else {}
    return {"type": name, "units": UNITS, **bias, **options}


def _run(spec, dtype, backend=CPU, sizes=(5, 3), steps=STEPS, features=FEATURES):
    """Forward and backward over batches of ``sizes`` in a row: (y, dx, parameter gradients) each."""
    layer = registry.layers.build(spec)
    model = Sequential([layer], (steps, features), backend, dtype, seed=0)
    rng = np.random.default_rng(1)
    out = []
    for n in sizes:
        x = model.backend.asarray(rng.standard_normal((n, steps, features)).astype(dtype))
        y = layer.forward(x)
        dx = layer.backward(model.backend.asarray(rng.standard_normal(y.shape).astype(dtype)))
        grads = {k: to_host(p.grad).copy() for k, p in layer.params.items()}
        out.append((to_host(y).copy(), to_host(dx).copy(), grads))
    return out


def _compare(got, want, rtol, atol):
    """Equal to ``rtol``, and to ``atol`` times the array's largest magnitude (at least 1): a sum
    of many terms that cancels keeps the rounding of its terms, not of its value."""
    def close(a, b, what):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.abs(b).max())), err_msg=what)

    for k, ((y1, dx1, g1), (y0, dx0, g0)) in enumerate(zip(got, want)):
        assert y1.dtype == y0.dtype and y1.shape == y0.shape
        close(y1, y0, f"output, batch {k}")
        close(dx1, dx0, f"input gradient, batch {k}")
        assert g1.keys() == g0.keys()
        for n in g0:
            close(g1[n], g0[n], f"gradient of {n}, batch {k}")


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-12, 1e-14), (np.float32, 1e-5, 1e-6)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_fused_cell_path_equals_the_cpu_path(name, options, dtype, rtol, atol, monkeypatch, per_step):
    cpu = _run(_spec(name, options), dtype)
    with emulate(monkeypatch) as calls:
        gpu = _run(_spec(name, options), dtype)
    # one cell launch per time step each way, for each of the two batches
    assert calls == {KERNELS[name]: 2 * STEPS, KERNELS[name] + "_grad": 2 * STEPS}, calls
    _compare(gpu, cpu, rtol, atol)


PATHS = [(name, False) for name in KERNELS] + [(name, True) for name in SEQUENCE]


@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("name,sequence", PATHS, ids=[n + ("-sequence" if s else "-per-step") for n, s in PATHS])
def test_the_fused_cell_path_equals_pytorch(name, sequence, return_sequences, monkeypatch):
    torch = pytest.importorskip("torch")
    if not sequence:
        _per_step(monkeypatch)
    n, steps, d, units = 4, 5, 3, 6
    layer = registry.layers.build({"type": name, "units": units, "return_sequences": return_sequences,
                                   "bias_initializer": {"type": "normal", "std": 0.3}})
    make(layer, (steps, d))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, steps, d))
    with emulate(monkeypatch) as calls:
        out = layer.forward(x)
        dy = rng.standard_normal(out.shape)
        dx = layer.backward(dy)
    kernel = SEQUENCE[name] if sequence else KERNELS[name]
    assert calls == {kernel: 1 if sequence else steps, kernel + "_grad": 1 if sequence else steps}, calls

    ref = twin(torch, name, layer, d)
    want, want_dx = outputs_and_input_gradient(torch, ref, x, dy, return_sequences)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-12)
    assert_weight_gradients_equal(layer, ref, name)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_fused_cell_path_passes_numeric_gradients(name, options, monkeypatch, per_step):
    layer = registry.layers.build(_spec(name, options))
    make(layer, (4, FEATURES))
    x = np.random.default_rng(3).standard_normal((3, 4, FEATURES))
    with emulate(monkeypatch) as calls:
        assert check_gradients(layer, x) > 0
    assert calls[KERNELS[name]] > 0 and calls[KERNELS[name] + "_grad"] > 0


# (units, batch sizes in a row, steps, threads a block may hold): units not a multiple of 32, fewer
# threads than rows or units (each thread loops over several), one step, the limit, one above it
SEQUENCE_SIZES = [(1, (2, 1), 3, 1024), (6, (5, 3), 7, 1024), (37, (4, 9), 5, 1024), (37, (3, 2), 4, 64),
                  (100, (2, 3), 1, 96), ("limit", (2, 3), 2, 1024), ("above", (2, 1), 2, 1024)]


@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-12, 1e-14), (np.float32, 2e-5, 2e-6)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("units,sizes,steps,threads", SEQUENCE_SIZES,
                         ids=[f"units={u}-batches={b}-steps={s}-threads={t}" for u, b, s, t in SEQUENCE_SIZES])
@pytest.mark.parametrize("name", list(SEQUENCE))
def test_the_sequence_kernels_equal_the_cpu_path(name, units, sizes, steps, threads, return_sequences, dtype, rtol,
                                                 atol, monkeypatch):
    """One launch each way per batch up to the limit of units, the per-step cells above it; the
    CPU's numbers to rounding (the kernel sums the recurrent product in its own order)."""
    limit = MODULES[name].SEQUENCE_UNITS
    units = {"limit": limit, "above": limit + 1}.get(units, units)
    spec = {**_spec(name, {"return_sequences": return_sequences}), "units": units}
    cpu = _run(spec, dtype, sizes=sizes, steps=steps)
    with emulate(monkeypatch, max_threads_per_block=threads) as calls, monkeypatch.context() as m:
        asked = _cells_asked_for(m)
        gpu = _run(spec, dtype, sizes=sizes, steps=steps)
    if units <= limit:
        assert calls == {SEQUENCE[name]: len(sizes), SEQUENCE[name] + "_grad": len(sizes)}, calls
        # (as test_the_cuda_sequence_kernels_equal_the_cpu checks on a device)
        assert not asked & {KERNELS[name], KERNELS[name] + "_grad"}, "the per-step cells were asked for"
    else:
        steps_run = len(sizes) * steps
        assert calls == {KERNELS[name]: steps_run, KERNELS[name] + "_grad": steps_run}, calls
    _compare(gpu, cpu, rtol, atol)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_sequence_kernels_pass_numeric_gradients(name, options, monkeypatch):
    layer = registry.layers.build({**_spec(name, options), "units": 5})
    make(layer, (4, FEATURES))
    x = np.random.default_rng(3).standard_normal((3, 4, FEATURES))
    with emulate(monkeypatch, max_threads_per_block=32) as calls:
        assert check_gradients(layer, x) > 0
    assert calls[SEQUENCE[name]] > 0 and calls[SEQUENCE[name] + "_grad"] > 0
    assert not calls[KERNELS[name]] and not calls[KERNELS[name] + "_grad"]


gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-10, 1e-12), (np.float32, 1e-4, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_cuda_cells_equal_the_cpu_at_the_adding_problems_size(name, options, dtype, rtol, atol, per_step):
    """Batches of 64 and 17, 20 steps, 32 units, as configs/adding_lstm.yaml trains."""
    spec = {**_spec(name, options), "units": 32}
    sizes = dict(sizes=(64, 17), steps=20, features=2)
    cpu = _run(spec, dtype, get_backend("cpu"), **sizes)
    on_gpu = _run(spec, dtype, get_backend("gpu"), **sizes)
    _compare(on_gpu, cpu, rtol, atol)
    built = {k.name for k in DECLARED if k._built is not None}
    assert {KERNELS[name], KERNELS[name] + "_grad"} <= built, "the GPU run did not take the fused cells"


def _cells_asked_for(monkeypatch):
    """The names of the elementwise kernels the layers ask for from here on."""
    asked, real = set(), Kernel.on

    def on(self, xp):
        asked.add(self.name)
        return real(self, xp)

    monkeypatch.setattr(Kernel, "on", on)
    return asked


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-10, 1e-12), (np.float32, 2e-4, 2e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("units,sizes,steps,features", [(32, (64, 17), 20, 2), ("limit", (16, 5), 12, 7),
                                                        (45, (3, 130), 9, 4)],
                         ids=["adding_lstm", "the-limit", "units=45"])
@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("name", list(SEQUENCE))
def test_the_cuda_sequence_kernels_equal_the_cpu(name, units, sizes, steps, features, return_sequences, dtype, rtol,
                                                 atol, monkeypatch):
    """The whole-sequence kernels on the device, against the CPU, and that they are what ran."""
    units = MODULES[name].SEQUENCE_UNITS if units == "limit" else units
    spec = {**_spec(name, {"return_sequences": return_sequences}), "units": units}
    cpu = _run(spec, dtype, get_backend("cpu"), sizes=sizes, steps=steps, features=features)
    asked = _cells_asked_for(monkeypatch)
    on_gpu = _run(spec, dtype, get_backend("gpu"), sizes=sizes, steps=steps, features=features)
    _compare(on_gpu, cpu, rtol, atol)
    assert not asked & {KERNELS[name], KERNELS[name] + "_grad"}, "the GPU run took the per-step cells"
    built = {k.name for k in BLOCK_KERNELS if np.dtype(dtype) in k._built}
    assert {SEQUENCE[name], SEQUENCE[name] + "_grad"} <= built, built
