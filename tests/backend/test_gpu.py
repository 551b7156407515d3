"""CPU (numpy) and GPU (CuPy) agree: every registered layer forward and backward (float64, and
float32 with the training loop's buffers), the fast training path, and every shipped config
trained end to end.

Marked ``gpu``; skipped where CuPy or a CUDA device is missing.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dlrun import metrics, registry
from dlrun.backend import get_backend, gpu_available, to_host
from dlrun.gradcheck.inputs import joined, joined_shape
from dlrun.model import Sequential
from dlrun.training import capture
from conftest import CONFIGS, _environment
from gpu_step_cases import (STEP_CASES, STEPS, UNCAPTURED, evaluate_batches, evaluates_uncaptured, same_training,
                            train_steps)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA device")]

DIMS = {"D": 5, "C": 4, "H": 6, "W": 7, "T": 3}
N = 3


def _dim(v):
    return DIMS.get(v, v) if isinstance(v, str) else v


def _inputs(spec, x_shape, rng):
    shape = (N,) + tuple(x_shape)
    if spec.kind == "index":
        return rng.integers(0, int(_dim(spec.high) or 2), shape)
    if spec.kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if spec.kind == "prob":
        e = np.exp(rng.standard_normal(shape))
        return e / e.sum(axis=-1, keepdims=True)
    return rng.standard_normal(shape)


def _layer(name, extra=None):
    """The layer built with its declared options, its input spec and its per-sample input shape.
    A layer with several inputs comes in gradcheck's joined form: one input holding its inputs
    side by side, whose gradient holds every input's gradient, so one comparison checks them all."""
    cls = registry.layers.get(name)
    spec = cls.input_spec
    layer = registry.layers.build({"type": name, **{k: _dim(v) for k, v in spec.options.items()}, **(extra or {})})
    if layer.num_inputs != 1:
        layer.__class__ = joined(type(layer))
        return layer, spec, joined_shape([tuple(_dim(d) for d in s) for s in spec.inputs])
    return layer, spec, tuple(_dim(d) for d in spec.shape)


class _Alone:
    """A layer set up and built on its own, as gradcheck does, answering the calls these tests
    make of a one-layer Sequential (which cannot hold a layer in its joined form)."""

    def __init__(self, layer, x_shape, backend, dtype):
        layer.setup(backend, dtype, np.random.default_rng(7), 7)
        self.output_shape = layer.build(x_shape)
        self.layers, self.backend = [layer], backend

    def train(self, mode=True):
        self.layers[0].training = mode

    def forward(self, x, y=None):
        return self.layers[0].forward(x)

    def backward(self, dy):
        return self.layers[0].backward(dy)

    def named_parameters(self):
        return [(f"0.{n}", p) for n, p in self.layers[0].params.items()]


def _build(name, backend, extra=None, dtype=np.float64):
    layer, spec, x_shape = _layer(name, extra)
    if hasattr(x_shape, "parts"):
        return _Alone(layer, x_shape, backend, dtype), spec, x_shape
    return Sequential([layer], x_shape, backend, dtype, seed=7), spec, x_shape


# options that switch a layer to another code path, checked on GPU as well as the defaults
# (Conv2D with padding 3 has 10x11 = 110 output pixels: its batched-GEMM layout, not one GEMM)
VARIANTS = [(n, None) for n in registry.layers.names()] + [("GELU", {"approximate": "tanh"}),
                                                                   ("LayerNorm", {"axes": 2}),
                                                                   ("Conv2D", {"padding": 3}),
                                                                   ("Conv2D", {"stride": 2, "padding": 0}),
                                                                   ("MultiHeadAttention", {"causal": True}),
                                                                   ("SequencePool", {"mode": "last"})]
VARIANT_IDS = [n + ("-" + "-".join(map(str, e.values())) if e else "") for n, e in VARIANTS]


@pytest.mark.parametrize("name,extra", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("training", [True, False])
def test_layer_forward_backward_match_cpu(name, extra, training):
    cpu, spec, x_shape = _build(name, get_backend("cpu"), extra)
    gpu, _, _ = _build(name, get_backend("gpu"), extra)
    if training and cpu.layers[0].stochastic:
        pytest.skip("random draws differ between numpy and CuPy generators; compared in eval mode")
    for (n, pc), (_, pg) in zip(cpu.named_parameters(), gpu.named_parameters()):
        np.testing.assert_array_equal(pc.data, to_host(pg.data), err_msg=f"initial {n}")
    rng = np.random.default_rng(0)
    x = _inputs(spec, x_shape, rng)
    y = None
    if cpu.layers[0].needs_labels:
        high = int(_dim(spec.labels) if spec.labels is not None else cpu.output_shape[-1])
        y = rng.integers(0, high, N)
    outs = []
    for model in (cpu, gpu):
        model.train(training)
        xp = model.backend.xp
        xd = model.backend.asarray(x if spec.kind == "index" else x.astype(np.float64))
        yd = None if y is None else model.backend.asarray(y)
        out = model.forward(xd, yd)
        dy = np.random.default_rng(1).standard_normal(out.shape)
        dx = model.backward(model.backend.asarray(dy))
        grads = {n: to_host(p.grad) for n, p in model.named_parameters() if p.trainable}
        outs.append((to_host(out), None if dx is None or spec.kind == "index" else to_host(dx), grads))
        assert xp is (np if model.backend.name == "cpu" else __import__("cupy"))
    (oc, dc, gc), (og, dg, gg) = outs
    np.testing.assert_allclose(og, oc, rtol=1e-7, atol=1e-9, err_msg="forward")
    if dc is not None:
        np.testing.assert_allclose(dg, dc, rtol=1e-7, atol=1e-9, err_msg="input gradient")
    for n in gc:
        np.testing.assert_allclose(gg[n], gc[n], rtol=1e-7, atol=1e-9, err_msg=f"gradient of {n}")


def test_conv2d_variants_take_the_layouts_they_are_meant_to():
    gpu = get_backend("gpu")
    layouts = {str(e): _build("Conv2D", gpu, e)[0].layers[0].layout for n, e in VARIANTS if n == "Conv2D"}
    assert layouts == {"None": "one_gemm", str({"padding": 3}): "batched", str({"stride": 2, "padding": 0}): "one_gemm"}


@pytest.mark.parametrize("name,extra", VARIANTS, ids=VARIANT_IDS)
def test_layer_float32_with_training_buffers_matches_cpu(name, extra):
    """The training loop's case: float32, reused buffers, batches of two sizes in a row (a
    buffer must follow the shape). Stochastic layers draw from different generators on the two
    devices, so they are compared in evaluation mode only (above)."""
    results = []
    for device in ("cpu", "gpu"):
        b = get_backend(device)
        model, spec, x_shape = _build(name, b, extra, np.float32)
        layer = model.layers[0]
        if layer.stochastic:
            pytest.skip("random draws differ between numpy and CuPy generators")
        layer.buffers.enabled = True
        rng = np.random.default_rng(2)
        runs = []
        for n in (4, 3, 4):
            x = _inputs(spec, x_shape, rng)
            x = np.concatenate([x, x])[:n] if n > N else x[:n]
            y = None
            if layer.needs_labels:
                high = int(_dim(spec.labels) if spec.labels is not None else model.output_shape[-1])
                y = b.asarray(rng.integers(0, high, n))
            xd = b.asarray(x if spec.kind == "index" else x.astype(np.float32))
            out = layer.forward(xd, y) if layer.needs_labels else layer.forward(xd)
            dy = b.asarray(rng.standard_normal(out.shape).astype(np.float32))
            dx = layer.backward(dy)
            runs.append((to_host(out).copy(), None if dx is None or spec.kind == "index" else to_host(dx).copy(),
                         {k: to_host(p.grad).copy() for k, p in layer.params.items() if p.trainable}))
        results.append(runs)
    for k, ((oc, dc, gc), (og, dg, gg)) in enumerate(zip(*results)):
        assert og.dtype == np.float32 and og.shape == oc.shape
        np.testing.assert_allclose(og, oc, rtol=1e-4, atol=1e-5, err_msg=f"forward, batch {k}")
        if dc is not None:
            assert dg.dtype == np.float32
            np.testing.assert_allclose(dg, dc, rtol=1e-4, atol=1e-5, err_msg=f"input gradient, batch {k}")
        for n in gc:
            np.testing.assert_allclose(gg[n], gc[n], rtol=1e-4, atol=1e-4, err_msg=f"gradient of {n}, batch {k}")


def test_fast_training_path_matches_cpu():
    from dlrun.optimizers import SGD
    from dlrun.training.trainer import Trainer

    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((50, 4)).astype(np.float32), rng.integers(0, 3, 50)
    hist = []
    for device in ("cpu", "gpu"):
        layers = [registry.layers.build(s) for s in ({"type": "Linear", "units": 16}, "ReLU",
                                                      {"type": "Linear", "units": 3})]
        model = Sequential(layers, (4,), get_backend(device), seed=0)
        opt = SGD(learning_rate=0.1, momentum=0.9)
        opt.block_size = 8  # blocked update on the CPU run (CuPy never blocks: one fused kernel over the flat arena)
        trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), opt, batch_size=16, shuffle=False)
        hist.append([r["train_loss"] for r in trainer.fit(x, y, epochs=5).rows])
    np.testing.assert_allclose(hist[1], hist[0], rtol=1e-4)


@pytest.mark.slow
def test_spiral_config_trains_on_gpu_like_on_cpu(cli, tmp_path):
    losses = {}
    for device in ("cpu", "gpu"):
        r = cli("train", CONFIGS / "spiral.yaml", "--device", device, "--set", "train.epochs=20",
                "--runs-dir", tmp_path / device)
        assert r.code == 0, r.err
        run_dir = next((tmp_path / device).iterdir())
        losses[device] = json.loads((run_dir / "summary.json").read_text())["train_loss"]
    assert losses["gpu"] == pytest.approx(losses["cpu"], rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_trains_on_the_gpu(config, tmp_path):
    """Three epochs of each shipped config on both devices, in float32 as shipped: the same losses
    (within float32 reduction order) where nothing is drawn on the device; with dropout the masks
    come from another generator, so there the GPU run must only train (finite, falling loss)."""
    from dlrun.config import load_config
    from dlrun.runs.run import train

    rows = {}
    for device in ("cpu", "gpu"):
        cfg = load_config(CONFIGS / config, overrides=["train.epochs=3"], device=device)
        result = train(cfg, runs_dir=tmp_path / device)
        assert result.trainer.model.backend.name == device
        rows[device] = [r["train_loss"] for r in result.history.rows]
    stochastic = any(layer.stochastic for layer in result.trainer.model.layers)
    assert len(rows["gpu"]) == 3 and np.all(np.isfinite(rows["gpu"]))
    if stochastic:
        assert rows["gpu"][-1] < rows["gpu"][0]
    else:
        np.testing.assert_allclose(rows["gpu"], rows["cpu"], rtol=2e-3)


OPTIMIZER_SPECS = [
    {"type": "SGD", "learning_rate": 0.1},
    {"type": "SGD", "learning_rate": 0.1, "weight_decay": 0.01},
    {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9},
    {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"type": "Adam", "learning_rate": 0.01},
    {"type": "Adam", "learning_rate": 0.01, "weight_decay": 0.01},
    {"type": "AdamW", "learning_rate": 0.01, "weight_decay": 0.1},
    {"type": "RMSProp", "learning_rate": 0.01},
    {"type": "RMSProp", "learning_rate": 0.01, "momentum": 0.8, "weight_decay": 0.01},
    {"type": "AdaGrad", "learning_rate": 0.1, "initial_accumulator_value": 0.1, "weight_decay": 0.01},
]


@pytest.mark.parametrize("spec", OPTIMIZER_SPECS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_fused_gpu_optimizer_update_matches_cpu(spec):
    """The one-kernel GPU updates agree with the numpy updates (blocked for the large tensor)."""
    from dlrun.layers.base import Parameter

    rng = np.random.default_rng(0)
    shapes = [(30, 7), (5,), (1 << 18,)]  # the last is larger than the CPU block size
    init = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(4)]
    final = {}
    for device in ("cpu", "gpu"):
        b = get_backend(device)
        params = [(f"p{i}", Parameter(b.asarray(w.copy()), b.asarray(np.zeros_like(w)))) for i, w in enumerate(init)]
        opt = registry.optimizers.build(dict(spec))
        opt.setup(params)
        for step in grads:
            for (_, p), g in zip(params, step):
                p.grad[...] = b.asarray(g)
            opt.step()
        final[device] = [to_host(p.data) for _, p in params] + [to_host(a) for a in opt.state_dict().values()]
    for c, g in zip(final["cpu"], final["gpu"]):
        np.testing.assert_allclose(g, c, rtol=1e-10, atol=1e-12)


# Holds the GPU until *flag becomes non-zero (or about ten seconds pass, so a bug cannot hang the suite).
_SPIN = r"""
extern "C" __global__ void dlrun_spin(volatile int* flag, long long max_cycles) {
    long long start = clock64();
    while (*flag == 0 && clock64() - start < max_cycles) { }
}
"""


@pytest.mark.parametrize("graph", [False, True], ids=["ordinary", "cuda_graph"])
@pytest.mark.parametrize("case", list(STEP_CASES))
def test_train_step_never_waits_for_the_host(case, graph):
    """The whole training step (forward, loss, device-side metrics, backward, regularizer,
    clipping, optimizer) is queued while the GPU is still held by a kernel that waits for a flag
    only the test sets afterwards: any device-to-host copy or synchronisation inside the step
    would block until that kernel gave up, and the step's work would already be done. With
    ``graph`` the step is a replay of its CUDA graph (with the copies into its inputs and the
    optimizer's per-step values). (tests/backend/test_gpu_step_host_reads.py checks the same cases
    without a GPU.)"""
    import cupy

    gpu = get_backend("gpu")
    trainer, callbacks = STEP_CASES[case].build(gpu)
    model = trainer.model
    sums = trainer.tracker.zeros()  # (fit makes them each epoch)
    step = trainer.training_step
    x, y = STEP_CASES[case].batch(np.random.default_rng(0))
    xb, yb = cupy.asarray(x), cupy.asarray(y)
    trainer.fast_mode(True)
    if not graph:
        step.graph = None
    warmup = 1 + capture.WARMUP + 1 if graph else 1  # (with the graph: the checked step, the ordinary ones, the capture)
    for _ in range(warmup):  # warm-up: kernels compiled, pool filled
        step(xb, yb, callbacks, sums=sums)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    gpu.synchronize()
    flag = cupy.zeros(1, dtype=np.int32)
    spin = cupy.RawKernel(_SPIN, "dlrun_spin")
    spin((1,), (1,), (flag, np.int64(20_000_000_000)))
    loss_total, correct = step(xb, yb, callbacks, sums=sums)
    queued = cupy.cuda.Event()
    queued.record()
    still_held = not queued.done
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        flag.fill(1)  # a kernel on another stream releases the spinner
    queued.synchronize()
    assert still_held, "the training step waited for the GPU (a host read or synchronisation inside the step)"
    assert trainer.step == warmup + 1
    if graph and case in UNCAPTURED:
        assert "calling cuBLAS API during stream capture" in step.graph.status, step.graph.status
    elif graph:
        assert step.graph.status == "captured" and step.graph.replays == 2
    changed = [n for n, p in model.named_parameters() if p.trainable and not cupy.array_equal(p.data, before[n])]
    assert changed, "the queued step updated no parameter"
    assert isinstance(loss_total, cupy.ndarray) and 0 < float(loss_total)  # a device scalar
    if trainer.classification:
        assert isinstance(correct, cupy.ndarray) and 0 <= int(correct) <= 16
    else:
        assert correct == 0


def test_embedding_trains_like_on_cpu_and_a_bad_index_is_named_at_the_epoch_end():
    """On GPU the training lookup reads nothing back: an index outside the table gives NaN rows,
    and the end-of-epoch check's replay names the index; the weights stay the last good ones."""
    from dlrun.errors import DataError
    from dlrun.training.trainer import Trainer

    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 10, (12, 5)).astype(np.float32), rng.integers(0, 3, 12)
    specs = [{"type": "Embedding", "input_dim": 10, "output_dim": 4}, "Flatten", {"type": "Linear", "units": 3}]

    def fit(device, data):
        model = Sequential([registry.layers.build(s) for s in specs], (5,), get_backend(device), np.float64, seed=0)
        trainer = Trainer(model, registry.losses.build("SoftmaxCrossEntropy"), registry.optimizers.build("SGD"),
                          batch_size=4, shuffle=False)
        start = to_host(model.layers[0].weight.data).copy()
        try:
            return [r["train_loss"] for r in trainer.fit(data, y, epochs=2).rows], None
        except DataError as e:
            np.testing.assert_array_equal(to_host(model.layers[0].weight.data), start)
            return None, e

    np.testing.assert_allclose(fit("gpu", x)[0], fit("cpu", x)[0], rtol=1e-10)
    bad = x.copy()
    bad[6, 2] = 12
    _, err = fit("gpu", bad)
    assert err is not None and "index 12 is outside [0, 10)" in str(err)


LOSS_CASES = {  # name -> (logit shape, labels: "classes" integers in [0, C), "binary" 0/1, "real" like z)
    "SoftmaxCrossEntropy": ((9, 5), "classes"), "NLL": ((9, 5), "classes"), "Hinge": ((9, 5), "classes"),
    "BinaryCrossEntropy": ((9, 1), "binary"), "MSE": ((9, 3), "real"), "Huber": ((9, 3), "real"),
}


@pytest.mark.parametrize("name", sorted(LOSS_CASES))
@pytest.mark.parametrize("pooled", [False, True], ids=["plain", "training-buffers"])
def test_loss_forward_backward_match_cpu(name, pooled):
    """Each loss (the fused GPU softmax cross-entropy included) agrees with numpy in float64."""
    shape, kind = LOSS_CASES[name]
    rng = np.random.default_rng(5)
    z = rng.standard_normal(shape) * 3
    y = {"classes": np.r_[np.arange(shape[1]), rng.integers(0, shape[1], shape[0] - shape[1])],
         "binary": rng.integers(0, 2, shape[0]), "real": rng.standard_normal(shape)}[kind]
    results = []
    for device in ("cpu", "gpu"):
        b = get_backend(device)
        loss = registry.losses.build(name)
        if getattr(loss, "buffers", None) is not None:
            loss.buffers.enabled = pooled
        value = loss.forward(b.asarray(z), b.asarray(y))
        results.append((float(value), to_host(loss.backward())))
    (vc, gc), (vg, gg) = results
    assert vg == pytest.approx(vc, rel=1e-12)
    np.testing.assert_allclose(gg, gc, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("pool", [2, [2, 3], 3])
@pytest.mark.parametrize("pooled", [False, True], ids=["plain", "training-buffers"])
def test_maxpool_fused_gpu_path_matches_cpu(pool, pooled):
    """Non-overlapping pools take the one-kernel GPU path: same maxima, same tie winner (first in
    row-major order), NaN windows propagate NaN and pass no gradient, floor-mode edges get 0."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 7, 8))
    x[x < 0.3] = 0.0  # many ties, as after a ReLU
    x[1, 2, 3, 4] = np.nan
    dy = None
    results = []
    for device in ("cpu", "gpu"):
        b = get_backend(device)
        model = Sequential([registry.layers.build({"type": "MaxPool2D", "pool_size": pool})], (4, 7, 8), b,
                           np.float64, seed=0)
        layer = model.layers[0]
        layer.buffers.enabled = pooled
        out = layer.forward(b.asarray(x))
        if dy is None:
            dy = rng.standard_normal(out.shape)
        dx = layer.backward(b.asarray(dy))
        if device == "gpu":
            assert layer._arg is not None, "the fused GPU path was not taken"
        results.append((to_host(out), to_host(dx)))
    (oc, dc), (og, dg) = results
    np.testing.assert_array_equal(og, oc)
    np.testing.assert_array_equal(dg, dc)


def test_gradcheck_checks_everything_on_the_gpu(cli):
    from dlrun.gradcheck import PASS, Settings, check_all

    reports = check_all(Settings(device="gpu"))
    assert [r.layer for r in reports if r.verdict != PASS] == []
    r = cli("gradcheck", "LargeMarginFC", "--device", "gpu", "--json")
    assert r.code == 0 and json.loads(r.out)["settings"]["device"] == "gpu", r.out + r.err
    r = cli("gradcheck", str(CONFIGS / "spiral.yaml"), "--device", "gpu")
    assert r.code == 0, r.out + r.err


@pytest.mark.parametrize("binary", [False, True], ids=["scores", "one-logit"])
def test_every_metric_sums_on_the_gpu_as_on_the_cpu(binary):
    """Every registered metric, its sums added over uneven batches on each device: equal values."""
    rng = np.random.default_rng(0)
    cases = {"classification": (rng.standard_normal((50, 1 if binary else 4)), rng.integers(0, 2 if binary else 4, 50),
                                "BinaryCrossEntropy" if binary else "SoftmaxCrossEntropy"),
             "regression": (rng.standard_normal((50, 3)), rng.standard_normal((50, 3)), "MSE")}
    for name in registry.metrics.names():
        metric_cls = registry.metrics.get(name)
        if binary and (metric_cls.task != "classification" or name == "top_k_accuracy"):
            continue
        z, y, loss_name = cases[metric_cls.task]
        values = {}
        for device in ("cpu", "gpu"):
            b = get_backend(device)
            loss = registry.losses.build(loss_name)
            spec = ({"type": name, "average": "binary"} if binary and name in ("precision", "recall", "f1")
                    else {"type": name, "k": 2} if name == "top_k_accuracy" else name)
            m = registry.metrics.build(spec)
            assert m.setup(loss, z.shape[1]) is None
            tracker = metrics.Tracker([m], b)
            sums = tracker.zeros()
            for lo, hi in ((0, 7), (7, 8), (8, 50)):
                tracker.add(sums, b.asarray(z[lo:hi]), b.asarray(y[lo:hi]), loss)
            values[device] = tracker.results(sums, "")[name]
        assert values["gpu"] == pytest.approx(values["cpu"], rel=1e-12), name


# A captured step's matrix products call cublasSgemm/cublasDgemm directly (CuPy refuses cuBLAS
# while capturing), and CuPy's own matmul may pick another cuBLAS kernel: on an H200 (CUDA 13),
# 20 steps of float32 training gave weights equal to within 2.3e-7 relative in four of the
# cases, the same bits in the others
DEVICE_RTOL = 1e-5


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_the_captured_step_trains_as_the_ordinary_step_on_the_device(case):
    """CUDA graph replays (train.cuda_graph) against the ordinary step, with a learning rate that
    changes every step and a short last batch: equal to float32 rounding (DEVICE_RTOL)."""
    gpu = get_backend("gpu")
    plain = train_steps(case, gpu, graph=False)
    graphed = train_steps(case, gpu)
    graph = graphed[0].training_step.graph
    if case in UNCAPTURED:
        assert "calling cuBLAS API during stream capture" in graph.status and graph.replays == 0, graph.status
        # the ordinary path both times, which is not bit for bit the same on a device when the step
        # adds with atomics (an Embedding's scatter-add: the order of the additions varies)
        same_training(plain, graphed, rtol=DEVICE_RTOL)
        return
    assert graph.status == "captured" and graph.replays == STEPS - 1 - capture.WARMUP
    same_training(plain, graphed, rtol=DEVICE_RTOL)


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_the_captured_evaluation_scores_as_the_ordinary_one_on_the_device(case):
    gpu = get_backend("gpu")
    plain = evaluate_batches(case, gpu, graph=False)
    graphed = evaluate_batches(case, gpu)
    graph = graphed[0].training_step.evaluation_graph
    if evaluates_uncaptured(case):
        assert graph.status == "not captured: the layer Embedding reads the device when it evaluates"
    else:
        assert graph.status == "captured" and graph.replays == STEPS - capture.WARMUP, graph.status
    for (t0, c0), (t1, c1) in zip(plain[1], graphed[1]):
        assert t1 == pytest.approx(t0, rel=DEVICE_RTOL) and abs(c1 - c0) <= 1
    if plain[2] is not None:
        np.testing.assert_allclose(graphed[2], plain[2], rtol=DEVICE_RTOL, atol=DEVICE_RTOL * np.abs(plain[2]).max())


@pytest.mark.parametrize("config,overrides", [
    ("spiral.yaml", ["train.epochs=40"]),
    ("iris.yaml", ["train.epochs=6", "train.batch_size=16", "train.schedule={type: cosine}",
                   "train.schedule_interval=step", "train.clip_norm=1.0", "train.metrics=[f1]"]),
    ("moons_dropout.yaml", ["train.epochs=4"]),
])
def test_a_run_trains_the_same_with_and_without_its_cuda_graph_on_the_device(config, overrides, tmp_path):
    from dlrun.config import load_config
    from dlrun.runs.run import train

    results = {}
    for graph in ("false", "auto"):
        c = load_config(CONFIGS / config, overrides=["device=gpu", f"train.cuda_graph={graph}", *overrides])
        results[graph] = train(c, runs_dir=tmp_path / graph)
    plain, graphed = results["false"], results["auto"]
    assert graphed.summary["cuda_graph"] == "captured", graphed.summary["cuda_graph"]
    assert [r["train_loss"] for r in graphed.history.rows] == [r["train_loss"] for r in plain.history.rows]
    if plain.history.rows[0]["val_loss"] is not None:  # validation by its own graph
        assert graphed.trainer.training_step.evaluation_graph.replays > 0
        assert [r["val_loss"] for r in graphed.history.rows] == pytest.approx(
            [r["val_loss"] for r in plain.history.rows], rel=DEVICE_RTOL)
    w0, w1 = plain.trainer.model.state_arrays(), graphed.trainer.model.state_arrays()
    for k in w0:
        np.testing.assert_array_equal(to_host(w1[k]), to_host(w0[k]), err_msg=k)


@pytest.mark.slow
def test_a_gpu_run_leaves_cupyx_and_scipy_unimported(tmp_path):
    """A CuPy array sent through numpy's ufunc dispatch (``x * 2``, ``x > 0``) imports
    cupyx.scipy.special, and SciPy with it, the first time: a fifth of a second of every GPU
    run's start. A whole run (training with validation and checkpoints, then evaluate) never does."""
    code = ("import pathlib, sys\nconfig, runs = sys.argv[1:3]\nfrom dlrun.console import main\n"
            "def dlrun(*args):\n"
            "    sys.argv = ['dlrun', *args]\n"
            "    try:\n        main()\n    except SystemExit as e:\n        assert not e.code, e.code\n"
            "dlrun('train', config, '--device', 'gpu', '--quiet', '--runs-dir', runs)\n"
            "dlrun('evaluate', str(next(pathlib.Path(runs).iterdir())), '--device', 'gpu')\n"
            "print(sorted(m for m in sys.modules if m.startswith(('cupyx.', 'scipy'))))\n")
    p = subprocess.run([sys.executable, "-c", code, str(CONFIGS / "spiral.yaml"), str(tmp_path / "runs")],
                       env=_environment({}), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]", p.stdout
