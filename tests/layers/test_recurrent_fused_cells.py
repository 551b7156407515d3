"""The recurrent layers' GPU path: each time step is its recurrent product and one fused cell
kernel (dlrun_lstm_step, dlrun_gru_step, dlrun_rnn_step and their _grad), forward and backward.

Without a GPU the kernels run their numpy emulators (tests/kernel_emulation.py), and the GPU path
must equal the CPU path to rounding in float64 and float32, over two batch sizes in a row, give
PyTorch's outputs and gradients, and pass float64 central differences. The ``gpu`` tests at the
end run the CUDA kernels against the CPU at the size of configs/adding_lstm.yaml. That no step
reads from the device is tests/backend/test_gpu_step_host_reads.py's (its recurrent case).
"""
from __future__ import annotations

import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU, KERNELS as DECLARED, get_backend, gpu_available, to_host
from dlrun.model import Sequential
from kernel_emulation import emulate
from layer_numgrad import check_gradients, make

KERNELS = {"LSTM": "dlrun_lstm_step", "GRU": "dlrun_gru_step", "SimpleRNN": "dlrun_rnn_step"}
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
def test_the_fused_cell_path_equals_the_cpu_path(name, options, dtype, rtol, atol, monkeypatch):
    cpu = _run(_spec(name, options), dtype)
    with emulate(monkeypatch) as calls:
        gpu = _run(_spec(name, options), dtype)
    # one cell launch per time step each way, for each of the two batches
    assert calls == {KERNELS[name]: 2 * STEPS, KERNELS[name] + "_grad": 2 * STEPS}, calls
    _compare(gpu, cpu, rtol, atol)


@pytest.mark.parametrize("return_sequences", [False, True])
@pytest.mark.parametrize("name", list(KERNELS))
def test_the_fused_cell_path_equals_pytorch(name, return_sequences, monkeypatch):
    torch = pytest.importorskip("torch")
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
    assert calls[KERNELS[name]] == calls[KERNELS[name] + "_grad"] == steps

    ref = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "SimpleRNN": torch.nn.RNN}[name](d, units, batch_first=True)
    ref = ref.double()
    with torch.no_grad():
        ref.weight_ih_l0.copy_(torch.from_numpy(layer.weight.data))
        ref.weight_hh_l0.copy_(torch.from_numpy(layer.recurrent.data))
        ref.bias_ih_l0.copy_(torch.from_numpy(layer.bias.data))
        if name == "GRU":
            ref.bias_hh_l0.copy_(torch.from_numpy(layer.params["recurrent_bias"].data))
        else:
            ref.bias_hh_l0.zero_()
    xt = torch.from_numpy(x).requires_grad_()
    seq, _ = ref(xt)
    want = seq if return_sequences else seq[:, -1]
    want.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    pairs = [("weight", ref.weight_ih_l0), ("recurrent", ref.weight_hh_l0), ("bias", ref.bias_ih_l0)]
    if name == "GRU":
        pairs.append(("recurrent_bias", ref.bias_hh_l0))
    for mine, theirs in pairs:
        np.testing.assert_allclose(layer.params[mine].grad, theirs.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=mine)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_fused_cell_path_passes_numeric_gradients(name, options, monkeypatch):
    layer = registry.layers.build(_spec(name, options))
    make(layer, (4, FEATURES))
    x = np.random.default_rng(3).standard_normal((3, 4, FEATURES))
    with emulate(monkeypatch) as calls:
        assert check_gradients(layer, x) > 0
    assert calls[KERNELS[name]] > 0 and calls[KERNELS[name] + "_grad"] > 0


gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,rtol,atol", [(np.float64, 1e-10, 1e-12), (np.float32, 1e-4, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_the_cuda_cells_equal_the_cpu_at_the_adding_problems_size(name, options, dtype, rtol, atol):
    """Batches of 64 and 17, 20 steps, 32 units, as configs/adding_lstm.yaml trains."""
    spec = {**_spec(name, options), "units": 32}
    sizes = dict(sizes=(64, 17), steps=20, features=2)
    cpu = _run(spec, dtype, get_backend("cpu"), **sizes)
    on_gpu = _run(spec, dtype, get_backend("gpu"), **sizes)
    _compare(on_gpu, cpu, rtol, atol)
    built = {k.name for k in DECLARED if k._built is not None}
    assert {KERNELS[name], KERNELS[name] + "_grad"} <= built, "the GPU run did not take the fused cells"
