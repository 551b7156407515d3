import numpy as np
import pytest

from dlrun import registry
from dlrun.backend import CPU, array_module, get_backend, gpu_available
from dlrun.errors import BackendError
from dlrun.model import Sequential


def test_cpu_backend_is_numpy():
    assert get_backend("cpu") is CPU and CPU.xp is np and array_module(np.zeros(1)) is np


def test_unknown_device():
    with pytest.raises(BackendError, match="unknown device 'tpu'"):
        get_backend("tpu")


@pytest.mark.skipif(gpu_available(), reason="a CUDA device is present")
def test_gpu_request_without_cupy_or_device_is_a_clear_error():
    with pytest.raises(BackendError, match="device 'gpu'") as e:
        get_backend("gpu")
    assert "--device cpu" in str(e.value) or "dlrun[gpu]" in str(e.value)


def test_scatter_add_keeps_repeated_indices():
    a = np.zeros((3, 2))
    CPU.scatter_add(a, np.array([0, 0, 2]), np.ones((3, 2)))
    assert a.tolist() == [[2, 2], [0, 0], [1, 1]]


def _model(backend, seed=7):
    layers = [registry.layers.build({"type": "Linear", "units": 5}), registry.layers.build("ReLU"),
              registry.layers.build({"type": "Linear", "units": 3})]
    return Sequential(layers, (4,), backend, np.float32, seed)


def test_initial_weights_depend_only_on_the_seed():
    a, b, c = _model(CPU).state_arrays(), _model(CPU).state_arrays(), _model(CPU, 8).state_arrays()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["0.weight"], c["0.weight"])


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")
def test_gpu_starts_from_identical_weights_and_matches_cpu():
    gpu = get_backend("gpu")
    mc, mg = _model(CPU), _model(gpu)
    for k, v in mc.state_arrays().items():
        assert np.array_equal(v, mg.state_arrays()[k])
    x = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(gpu.to_host(mg.forward(gpu.asarray(x))), mc.forward(x), rtol=1e-5, atol=1e-6)


def test_cpu_accumulator_zero_is_a_float64_scalar_that_float32_values_add_into_exactly():
    zero = get_backend("cpu").zero(np.float64)
    assert isinstance(zero, np.float64) and zero == 0
    total = zero
    for v in (np.float32(1e8), np.float32(1.0), np.float32(-1e8)):
        total += v  # float32 alone would lose the 1.0
    assert total.dtype == np.float64 and total == 1.0
    assert get_backend("cpu").zero(np.int64).dtype == np.int64


def test_scatter_add_accepts_what_numpy_add_at_accepts():
    """The flat fast path for whole rows must not narrow the API: lists, broadcast or scalar
    values, unsigned and negative indices behave as np.add.at, and a bad row is reported in rows."""
    from dlrun.backend import CPU

    rng = np.random.default_rng(0)
    cases = [
        (np.array([0, 2, 2]), rng.standard_normal((3, 3))),  # whole rows (the fast path)
        (np.array([-1, 0, -1, 3]), rng.standard_normal((4, 3))),  # negative indices, fast path
        ([0, 2, 2], rng.standard_normal((3, 3))),
        (np.array([0, 2, 2]), 1.5),
        (np.array([0, 2, 2]), rng.standard_normal((3, 1))),
        (np.array([0, 2, 2], dtype=np.uint64), rng.standard_normal((3, 3))),
        (np.array([], dtype=np.int64), np.zeros((0, 3))),
    ]
    for indices, values in cases:
        a, ref = np.ones((4, 3)), np.ones((4, 3))
        np.add.at(ref, indices, values)
        CPU.scatter_add(a, indices, values)
        np.testing.assert_array_equal(a, ref)
    with pytest.raises(IndexError, match="index 5 is out of bounds for axis 0 with size 4"):
        CPU.scatter_add(np.zeros((4, 3)), np.array([5]), np.ones((1, 3)))


class _CountingBackend(type(CPU)):
    """The CPU backend, counting the generators it makes."""

    def __init__(self):
        super().__init__("cpu", np)
        self.made = 0

    def rng(self, seed):
        self.made += 1
        return super().rng(seed)


def test_a_layer_generator_is_made_only_when_the_layer_draws():
    """A CuPy generator holds per-thread state in device memory and costs a kernel launch to
    seed: layers that never draw (all but Dropout here) must not make one."""
    backend = _CountingBackend()
    layers = [registry.layers.build(s) for s in ({"type": "Linear", "units": 5}, "ReLU",
                                                 {"type": "Dropout", "rate": 0.5}, {"type": "Linear", "units": 3})]
    model = Sequential(layers, (4,), backend, np.float32, seed=7)
    assert backend.made == 0 and all(layer.rng_made is None for layer in model.layers)
    x = np.ones((6, 4), np.float32)
    model.train(True)
    out = model.forward(x)
    assert backend.made == 1 and [layer.rng_made is not None for layer in model.layers] == [False, False, True, False]
    # made late or early, a layer's generator draws the same numbers for the same seed
    eager = Sequential([registry.layers.build(s) for s in ({"type": "Linear", "units": 5}, "ReLU",
                                                           {"type": "Dropout", "rate": 0.5},
                                                           {"type": "Linear", "units": 3})], (4,), CPU, np.float32, seed=7)
    assert all(layer.rng is not None for layer in eager.layers)  # reading rng makes each one
    eager.train(True)
    np.testing.assert_array_equal(eager.forward(x), out)


def test_seed_rng_drops_the_generator_and_a_given_generator_is_kept():
    layer = registry.layers.build({"type": "Dropout", "rate": 0.5})
    assert layer.rng is None  # outside a model: no seed, no generator
    layer.seed_rng(3)
    first = layer.rng.random(4)
    layer.seed_rng(3)
    np.testing.assert_array_equal(layer.rng.random(4), first)
    own = np.random.default_rng(5)
    layer.rng = own
    assert layer.rng is own and layer.rng_made is own


def test_memory_available_is_the_least_of_the_os_the_cgroup_and_ulimit_v(monkeypatch):
    import dlrun.backend.memory as b

    monkeypatch.setattr(b, "_os_available", lambda: 20 * 2**30)
    monkeypatch.setattr(b, "_cgroup_available", lambda: None)
    monkeypatch.setattr(b, "_rlimit_available", lambda: None)
    assert b.host_memory_available() == 20 * 2**30 == CPU.memory_available()
    monkeypatch.setattr(b, "_cgroup_available", lambda: 4 * 2**30)  # a container's limit
    assert b.host_memory_available() == 4 * 2**30
    monkeypatch.setattr(b, "_rlimit_available", lambda: 2**30)  # ulimit -v
    assert b.host_memory_available() == 2**30
    for f in ("_os_available", "_cgroup_available", "_rlimit_available"):
        monkeypatch.setattr(b, f, lambda: None)
    assert b.host_memory_available() is None
    b.ensure_fits(10**18, "anything")  # nothing says: nothing refused


def test_an_address_space_limit_counts_as_the_memory_left():
    import subprocess
    import sys

    code = ("import resource, dlrun.backend.memory as b; resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30)); "
            "print(b._rlimit_available(), b.host_memory_available())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    left, available = int(out[0]), int(out[1])
    assert 0 < left < 3 * 2**30 and available <= left


def test_ensure_fits_names_the_figures(monkeypatch):
    import dlrun.backend.memory as b

    monkeypatch.setattr(b, "host_memory_available", lambda: 2**30)
    b.ensure_fits(2**30, "exactly what is left")
    with pytest.raises(MemoryError) as e:
        b.ensure_fits(4e12, "x of shape (10, 10) in float64")
    assert str(e.value) == "x of shape (10, 10) in float64 needs about 3.6 TiB, more than the 1.0 GiB of memory available"
