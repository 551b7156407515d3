"""The training step captured in a CUDA graph (train.cuda_graph) trains exactly as the ordinary
step, checked without a GPU.

tests/device_emulation.py's stand-in for CuPy captures a graph the way CuPy's stream capture
does: it records every device operation of the captured call with its arguments as they were,
undoes their effects (a capture runs nothing), and a replay re-executes the recorded operations
alone, with none of the step's Python. Any value that changes between steps but reaches the
device as a Python argument (a learning rate, Adam's bias corrections, a counter), or host work
the step needs, is then frozen at its capture-time value, and the captured training drifts from
the ordinary one. tests/backend/test_gpu.py compares the two on a real device.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import dlrun.backend.backend as backend_module
from dlrun.commands.timing import time_config
from dlrun.config import load_config
from dlrun.errors import NonFiniteError, TrainingError
from dlrun.layers.linear import Linear
from dlrun.optimizers.adam import Adam
from dlrun.optimizers.sgd import SGD
from dlrun.runs import run
from dlrun.training import capture
from dlrun.training.hooks import Callback
from conftest import CONFIGS, run_cli
from device_emulation import CaptureError, FAKE_CUPY, HostRead, emulated_gpu
from gpu_step_cases import (STEP_CASES, STEPS, UNCAPTURED, evaluate_batches, evaluates_uncaptured, same_training,
                            train_steps)
from kernel_emulation import emulate

def _counting_forwards(monkeypatch, model) -> list:
    """A list that gets an entry each time a model of ``model``'s class runs its forward in Python."""
    calls, real = [], type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_the_captured_step_trains_exactly_as_the_ordinary_step(case, monkeypatch):
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        plain = train_steps(case, gpu, graph=False)
        forwards = _counting_forwards(monkeypatch, plain[0].model)
        graphed = train_steps(case, gpu)
    graph = graphed[0].training_step.graph
    if case in UNCAPTURED:
        assert graph.status.startswith("not captured: the capture failed") and UNCAPTURED[case] in graph.status
        assert "calling cuBLAS API during stream capture" in graph.status and graph.replays == 0
        same_training(plain, graphed)
        return
    assert graph.status == "captured", graph.status
    replays = STEPS - 1 - capture.WARMUP
    assert graph.replays == replays
    # the model's Python ran for the ordinary steps and the capture only: the replays are the graph alone
    assert len(forwards) == STEPS + 1 - replays + 1 - 1  # (the first step's forward is the checked one)
    same_training(plain, graphed)


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_the_captured_evaluation_scores_exactly_as_the_ordinary_one(case, monkeypatch):
    """Each epoch's validation replays a graph of its own per batch shape: the forward in
    evaluation mode, the loss and the metric sums, with the same results."""
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        plain = evaluate_batches(case, gpu, graph=False)
        forwards = _counting_forwards(monkeypatch, plain[0].model)
        graphed = evaluate_batches(case, gpu)
    graph = graphed[0].training_step.evaluation_graph
    assert graphed[1] == plain[1]  # every batch's score
    np.testing.assert_array_equal(graphed[2], plain[2])  # the metric sums
    if evaluates_uncaptured(case):
        assert graph.status == "not captured: the layer Embedding reads the device when it evaluates"
        return
    if case in UNCAPTURED:
        assert graph.status.startswith("not captured: the capture failed") and UNCAPTURED[case] in graph.status
        return
    assert graph.status == "captured", graph.status
    assert graph.replays == STEPS - capture.WARMUP  # (the capture's own run included)
    # the model's Python ran for the ordinary batches, the capture and the smaller batch only
    # (the first training step, which is checked, runs the layers one by one)
    assert len(forwards) == capture.WARMUP + 1 + 1


def test_an_evaluation_graph_whose_state_a_restore_rebinds_is_captured_again(monkeypatch):
    def rebind(trainer):
        for layer in trainer.model.layers:
            for a in layer.state:
                setattr(layer, a, copy.deepcopy(getattr(layer, a)))

    case = "mlp+batchnorm+dropout, Adam, L2, clip_norm"
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        plain = evaluate_batches(case, gpu, graph=False, batches=12, middle=rebind)
        graphed = evaluate_batches(case, gpu, batches=12, middle=rebind)
    # captured twice; the batch that finds the arrays rebound runs the ordinary path
    assert graphed[0].training_step.evaluation_graph.replays == 12 - 2 * capture.WARMUP - 1
    assert graphed[1] == plain[1]
    np.testing.assert_array_equal(graphed[2], plain[2])


def test_a_plugin_part_keeps_the_evaluation_uncaptured(monkeypatch):
    class Halve(Linear):  # a plugin (defined outside dlrun) may keep per-step values on the host
        pass

    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        trainer, _ = STEP_CASES["Hinge"].build(gpu)
        trainer.model.layers[0].__class__ = Halve
        x, y = STEP_CASES["Hinge"].batch(np.random.default_rng(0))
        for _ in range(capture.WARMUP + 2):
            trainer.training_step.evaluate(gpu.asarray(x), gpu.asarray(y))
    graph = trainer.training_step.evaluation_graph
    assert graph.replays == 0
    assert graph.status == "not captured: the layer Halve is a plugin, which may keep per-step values on the host"


@pytest.mark.parametrize("what", ["state", "rng"])
def test_state_that_a_restore_rebinds_is_captured_again(what, monkeypatch):
    """The non-finite guard's restore puts new arrays and generators into the layers (running
    statistics, Dropout's generator): the graph, which still points at the old ones, is replaced."""
    def rebind(trainer):
        for layer in trainer.model.layers:
            for a in layer.state if what == "state" else ():
                setattr(layer, a, copy.deepcopy(getattr(layer, a)))
            if layer.stochastic and what == "rng":
                layer.rng = copy.deepcopy(layer.rng)

    case = "mlp+batchnorm+dropout, Adam, L2, clip_norm"
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        plain = train_steps(case, gpu, graph=False, steps=12, middle=rebind)
        graphed = train_steps(case, gpu, steps=12, middle=rebind)
    assert graphed[0].training_step.graph.replays == 12 - 1 - 2 * capture.WARMUP - 1  # captured twice
    same_training(plain, graphed)


def test_a_python_scalar_baked_into_the_captured_step_makes_the_replays_drift(monkeypatch):
    """The emulated capture sees what a real one would get wrong: Adam's step size, given to the
    device as a Python float (a fill with it), is frozen at its capture-time value."""
    def baked(self, state, p):
        h = self.hyper
        h[0], h[1], h[2] = self._lr_t, self._eps_t, 1.0  # three fills with Python floats, not a copy from the host
        _update(self, state, p)

    _update = Adam._update
    case = "AdamW"
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(Adam, "_update", baked)
        plain = train_steps(case, gpu, graph=False)
        graphed = train_steps(case, gpu)
    assert graphed[0].training_step.graph.status == "captured"
    with pytest.raises(AssertionError):
        same_training(plain, graphed)


@pytest.mark.parametrize("fault", ["host copy", "host read"])
def test_a_step_that_needs_the_host_is_not_captured_and_still_trains_right(fault, monkeypatch):
    real = SGD._update_fused

    def needs_host(self, xp, g, state, p):
        if fault == "host copy":
            g += xp.asarray(np.zeros(g.shape, g.dtype))  # a host-to-device copy: refused while capturing
        else:
            g *= float(g.sum()) * 0 + 1  # a read of the device: refused while capturing
        real(self, xp, g, state, p)

    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(SGD, "_update_fused", needs_host)
        plain = train_steps("Hinge", gpu, graph=False)
        graphed = train_steps("Hinge", gpu)
        status = graphed[0].training_step.graph.status
        assert status.startswith("not captured: the capture failed"), status
        assert ("CaptureError" if fault == "host copy" else "HostRead") in status
        same_training(plain, graphed)
        trainer, callbacks = STEP_CASES["Hinge"].build(gpu)
        trainer.training_step.graph.mode = True  # train.cuda_graph: true
        x, y = STEP_CASES["Hinge"].batch(np.random.default_rng(0))
        with pytest.raises(TrainingError, match="train.cuda_graph: true, but the capture failed"):
            for _ in range(capture.WARMUP + 2):
                trainer.training_step(gpu.asarray(x), gpu.asarray(y))


def test_the_stand_in_refuses_what_a_capture_cannot_hold(monkeypatch):
    with emulated_gpu(monkeypatch) as gpu:
        a = gpu.asarray(np.arange(3.0))
        stream = FAKE_CUPY.cuda.Stream(non_blocking=True)
        stream.begin_capture()
        try:
            with pytest.raises(CaptureError):
                FAKE_CUPY.asarray(np.ones(3))
            with pytest.raises(CaptureError):
                a.set(np.ones(3))
            with pytest.raises(CaptureError):
                a[[0, 2]]  # CuPy copies a list index to the device
            with pytest.raises(CaptureError):
                a + np.ones(3)  # CuPy refuses a numpy operand
            with pytest.raises(HostRead):
                float(a.sum())
            a *= 2  # recorded, and undone when the capture ends
        finally:
            graph = stream.end_capture()
        np.testing.assert_array_equal(a, [0, 1, 2])
        graph.launch()
        graph.launch()
        np.testing.assert_array_equal(a, [0, 4, 8])


class _AfterBackward(Callback):
    def on_after_backward(self, trainer):
        pass


class _Mine(Linear):  # a layer of a plugin (any module outside dlrun)
    pass


class _PluginSGD(SGD):  # a subclass that does not declare that its update is capturable
    pass


@pytest.mark.parametrize("change,why", [
    (lambda t: setattr(t.training_step, "accumulator", object()), "gradient accumulation"),
    (lambda t: setattr(t.training_step, "optimizer", _PluginSGD(0.1)), "the optimizer _PluginSGD does not declare"),
    (lambda t: t.model.run_order.__setitem__(0, _Mine(3)), "the layer _Mine is a plugin"),
])
def test_what_cannot_be_captured_says_why(change, why, monkeypatch):
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        trainer, _ = STEP_CASES["Hinge"].build(gpu)
        assert capture.blocker(trainer.training_step) is None
        assert capture.blocker(trainer.training_step, [_AfterBackward()]) == \
            "the callback _AfterBackward acts inside the step (on_after_backward)"
        change(trainer)
        assert why in capture.blocker(trainer.training_step)
    assert capture.blocker(STEP_CASES["Hinge"].build(backend_module.CPU)[0].training_step) == \
        "the CPU runs no CUDA graphs"


def test_cuda_graph_true_where_the_step_cannot_be_captured_is_refused_in_one_line(tmp_path):
    r = run_cli("train", str(CONFIGS / "spiral.yaml"), "--set", "train.cuda_graph=true", "--runs-dir", str(tmp_path))
    assert r.code == 2
    line = (r.out + r.err).strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert line == ("error: --set train.cuda_graph=true: train.cuda_graph: true, but the training step cannot be "
                    "captured in a CUDA graph: the CPU runs no CUDA graphs; set train.cuda_graph to auto (capture "
                    "where possible) or false")
    assert not list(tmp_path.iterdir())  # nothing written


def _fit(monkeypatch, name, overrides, runs, resume_to=None):
    """Train a shipped config on the emulated GPU; with ``resume_to``, then resume it to that many epochs."""
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(backend_module, "_gpu", gpu)
        result = run.train(load_config(CONFIGS / name, overrides=["device=gpu", *overrides]), runs_dir=runs)
        if resume_to is not None:
            config, ckpt = run.resume_config(result.run_dir, [f"train.epochs={resume_to}"])
            result = run.resume(result.run_dir, config, ckpt)
        weights = {n: np.array(a) for n, a in result.trainer.model.state_arrays().items()}
    return result, weights


@pytest.mark.slow
def test_a_run_trains_resumes_and_stops_early_the_same_with_and_without_the_graph(monkeypatch, tmp_path):
    """iris in batches (a short last batch each epoch) with a per-step schedule, clipping, train.metrics and early
    stopping: captured, and captured then resumed, as without a graph."""
    common = ["train.epochs=8", "train.batch_size=16", "train.schedule={type: cosine}", "train.schedule_interval=step",
              "train.clip_norm=1.0", "train.metrics=[f1]", "optimizer={type: Adam, learning_rate: 0.05}",
              "train.early_stopping={monitor: train_loss, patience: 2, min_delta: 0.5}"]
    plain, w0 = _fit(monkeypatch, "iris.yaml", common + ["train.cuda_graph=false"], tmp_path / "a")
    graphed, w1 = _fit(monkeypatch, "iris.yaml", common, tmp_path / "b")
    assert graphed.summary["cuda_graph"] == "captured" and graphed.trainer.training_step.graph.replays > 10
    assert graphed.trainer.training_step.evaluation_graph.replays > 0  # iris holds 30 flowers back: 2 batches of 16
    assert plain.summary["cuda_graph"] == "not captured: train.cuda_graph is false"
    for key in ("train_loss", "val_loss", "val_accuracy", "val_f1"):
        assert [r[key] for r in graphed.history.rows] == [r[key] for r in plain.history.rows], key
    assert graphed.summary["stopped_early"] == plain.summary["stopped_early"]
    for k in w0:
        np.testing.assert_array_equal(w1[k], w0[k], err_msg=k)
    common[0] = "train.epochs=3"  # 3 epochs, then resumed up to 8: the same with and without the graph
    _, w2 = _fit(monkeypatch, "iris.yaml", common + ["train.cuda_graph=false"], tmp_path / "c", resume_to=8)
    _, w3 = _fit(monkeypatch, "iris.yaml", common, tmp_path / "d", resume_to=8)
    for k in w2:
        np.testing.assert_array_equal(w3[k], w2[k], err_msg=k)


def test_a_non_finite_loss_is_named_the_same_with_the_graph(monkeypatch, tmp_path):
    """The epoch's replay that names the first non-finite value runs the ordinary step."""
    overrides = ["train.epochs=3", "train.batch_size=16", "optimizer={type: SGD, learning_rate: 1e3}"]
    errors = []
    for graph in ("false", "auto"):
        with pytest.raises(NonFiniteError) as e:
            _fit(monkeypatch, "iris.yaml", overrides + [f"train.cuda_graph={graph}"], tmp_path / graph)
        errors.append(str(e.value).replace(str(tmp_path / graph), "RUNS"))
    assert errors[0] == errors[1] and "epoch 1, batch 8:" in errors[0]  # (captured at batch 4)


def test_dlrun_train_verbose_on_the_gpu_says_whether_the_step_was_captured(monkeypatch, tmp_path):
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(backend_module, "_gpu", gpu)
        r = run_cli("train", str(CONFIGS / "iris.yaml"), "--device", "gpu", "--set", "train.epochs=2", "--verbose",
                    "--runs-dir", str(tmp_path), process=False)
    assert r.code == 0, r.err
    assert r.out.splitlines()[-2:-1] == ["CUDA graph: captured"]  # after the closing lines, before the run directory


def test_dlrun_time_on_the_gpu_says_whether_the_step_was_captured_and_times_it_both_ways(monkeypatch):
    with emulated_gpu(monkeypatch) as gpu, emulate(monkeypatch):
        monkeypatch.setattr(backend_module, "_gpu", gpu)
        r = run_cli("time", str(CONFIGS / "spiral.yaml"), "--device", "gpu", "--batches", "3", process=False)
        assert r.code == 0, r.err
        report = time_config(load_config(CONFIGS / "iris.yaml", overrides=["device=gpu"]), batches=3)
    assert "whole step, unobserved" in r.out and "whole step, CUDA graph" in r.out
    assert "CUDA graph (train.cuda_graph): captured" in r.out
    assert report.cuda_graph == "captured" and report.graph_step > 0 and report.plain_step > 0
