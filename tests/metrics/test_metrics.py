"""train.metrics: each metric summed over uneven batches equals its closed form on all the
samples at once (written out here, independently of dlrun.metrics), and the trainer records
them as train_NAME and val_NAME, monitors them, checkpoints their sums and reports bad specs."""
from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

from checkpoint_helpers import spiral_config
from conftest import run_cli, write
from dlrun import metrics, registry
from dlrun.runs import run
from dlrun.runs.assembly import assemble
from dlrun.data import load_data
from dlrun.backend import get_backend
from dlrun.config import config_from_dict, load_config
from dlrun.errors import CheckpointError, ConfigError, Interrupted
BinaryCrossEntropy, MSE, SoftmaxCrossEntropy = (registry.losses.get(n) for n in ("BinaryCrossEntropy", "MSE", "SoftmaxCrossEntropy"))
from resume_helpers import InterruptAt

CPU = get_backend("cpu")
BATCHES = [0, 7, 8, 30, 31, 64]  # uneven batches, one of a single sample


def streamed(metric, loss, outputs, z, y):
    """The metric's value from sums added batch by batch, as the trainer adds them."""
    assert metric.setup(loss, outputs) is None
    tracker = metrics.Tracker([metric], CPU)
    sums = tracker.zeros()
    for a, b in zip(BATCHES, BATCHES[1:]):
        tracker.add(sums, z[a:b], y[a:b], loss)
    return tracker.results(sums, "")[metric.registered_name]


def classify_data(classes=4, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(64, classes)).astype(np.float32)
    y = rng.integers(0, classes, size=64)
    z[np.arange(0, 64, 3), y[::3]] += 1.5  # better than chance, so precision and recall differ by class
    return z, y


def per_class_oracle(y, pred, classes):
    """Precision, recall, F1 and support per class by counting, one class at a time."""
    out = []
    for k in range(classes):
        tp = int(np.sum((pred == k) & (y == k)))
        p = tp / np.sum(pred == k) if np.sum(pred == k) else 0.0
        r = tp / np.sum(y == k) if np.sum(y == k) else 0.0
        out.append((p, r, 2 * p * r / (p + r) if p + r else 0.0, int(np.sum(y == k))))
    return np.array(out)


@pytest.mark.parametrize("average", ["macro", "weighted"])
@pytest.mark.parametrize("name", ["precision", "recall", "f1"])
def test_precision_recall_f1_equal_counting_over_all_samples(name, average):
    z, y = classify_data(classes=5)
    y[y == 4] = 3  # class 4 is never a label; the macro mean covers it only where it is predicted
    pred = z.argmax(1)
    table = per_class_oracle(y, pred, 5)
    col = ["precision", "recall", "f1"].index(name)
    present = (table[:, 3] > 0) | np.isin(np.arange(5), pred)
    want = (table[present, col].mean() if average == "macro"
            else (table[:, col] * table[:, 3]).sum() / table[:, 3].sum())
    got = streamed(registry.metrics.build({"type": name, "average": average}), SoftmaxCrossEntropy(), 5, z, y)
    assert got == pytest.approx(want, rel=1e-12)


def test_binary_average_scores_class_one_of_a_single_logit():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(64, 1)).astype(np.float32)
    y = (rng.random(64) < 0.4).astype(np.int64)
    pred = (z[:, 0] > 0).astype(int)
    tp, fp, fn = np.sum((pred == 1) & (y == 1)), np.sum((pred == 1) & (y == 0)), np.sum((pred == 0) & (y == 1))
    for name, want in (("precision", tp / (tp + fp)), ("recall", tp / (tp + fn)), ("f1", 2 * tp / (2 * tp + fp + fn))):
        got = streamed(registry.metrics.build({"type": name, "average": "binary"}), BinaryCrossEntropy(), 1, z, y)
        assert got == pytest.approx(want, rel=1e-12), name


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_accuracy_equals_ranking_and_counts_ties_as_hits(k):
    z, y = classify_data(classes=4)
    z[5] = [1.0, 1.0, 1.0, 1.0]  # a four-way tie: every k counts it (tf.math.in_top_k)
    y[5] = 2
    rank = np.array([np.sum(z[i] > z[i, y[i]]) for i in range(len(y))])  # classes strictly above the label
    got = streamed(registry.metrics.build({"type": "top_k_accuracy", "k": k}), SoftmaxCrossEntropy(), 4, z, y)
    assert got == pytest.approx(np.mean(rank < k), rel=1e-12)
    if k == 1:  # without ties, top-1 is the accuracy
        assert got == pytest.approx(np.mean(z.argmax(1) == y) + 1 / 64 * (z[5].argmax() != 2), rel=1e-12)


def test_regression_metrics_equal_their_closed_forms_over_every_output():
    rng = np.random.default_rng(2)
    t = rng.normal(3.0, 2.0, size=(64, 3)).astype(np.float32)
    t[:, 2] = 0.7  # a constant output: R² 0 unless predicted exactly
    z = (t + rng.normal(0, 0.5, size=t.shape)).astype(np.float32)
    d = z.astype(np.float64) - t
    r2 = [1 - np.sum(d[:, j] ** 2) / np.sum((t[:, j] - t[:, j].mean()) ** 2) for j in range(2)] + [0.0]
    want = {"mae": np.abs(d).mean(), "mse": (d ** 2).mean(), "rmse": np.sqrt((d ** 2).mean()), "r2": np.mean(r2)}
    for name, value in want.items():
        assert streamed(registry.metrics.build(name), MSE(), 3, z, t) == pytest.approx(value, rel=1e-6), name
    exact = z.copy()
    exact[:, 2] = 0.7
    d2 = exact.astype(np.float64) - t
    r2_exact = np.mean([1 - np.sum(d2[:, j] ** 2) / np.sum((t[:, j] - t[:, j].mean()) ** 2) for j in range(2)] + [1.0])
    assert streamed(registry.metrics.build("r2"), MSE(), 3, exact, t) == pytest.approx(r2_exact, rel=1e-6)
    # one output, targets given as a vector
    assert streamed(registry.metrics.build("mae"), MSE(), 1, z[:, :1], t[:, 0]) == pytest.approx(np.abs(d[:, 0]).mean(), rel=1e-6)


def test_r2_keeps_its_precision_for_targets_far_from_zero():
    """Σy² − (Σy)²/n would cancel 1e4² against itself; the batch-wise mean and deviations do not."""
    rng = np.random.default_rng(5)
    t = 1e4 + rng.normal(0, 0.5, size=(64, 1))
    z = t + rng.normal(0, 0.1, size=t.shape)
    want = 1 - np.sum((z - t) ** 2) / np.sum((t - t.mean()) ** 2)
    assert streamed(registry.metrics.build("r2"), MSE(), 1, z, t) == pytest.approx(want, rel=1e-9)


def test_a_metric_with_no_samples_has_no_value():
    m = registry.metrics.build("mae")
    m.setup(MSE(), 1)
    assert metrics.Tracker([m], CPU).results(np.zeros(2), "val_") == {"val_mae": None}


def test_mode_follows_the_metric():
    assert [metrics.metric_mode(m) for m in ("val_loss", "train_accuracy", "val_mae", "val_f1", "train_r2",
                                             "val_top_k_accuracy", "val_rmse")] == \
        ["min", "max", "min", "max", "max", "max", "min"]


BASE = {"seed": 0, "data": {"type": "blobs", "classes": 3, "samples": 120, "seed": 0},
        "model": [{"type": "Linear", "units": 3}], "loss": "SoftmaxCrossEntropy",
        "optimizer": {"type": "SGD", "learning_rate": 1e-30},
        "train": {"epochs": 2, "batch_size": 25, "validation_split": 0.25, "metrics": ["f1", "recall"]}}


def test_trainer_records_the_metrics_of_the_model_it_trains(tmp_path):
    """With a learning rate far below float32 rounding the weights never move, so train_NAME (summed while training)
    and val_NAME equal the metric of the fixed model's predictions on each set."""
    result = run.train(config_from_dict(json.loads(json.dumps(BASE))), tmp_path)
    row = result.history.last
    ds, model = load_data(config_from_dict(json.loads(json.dumps(BASE)))), result.trainer.model
    for prefix, x, y in (("train", ds.x, ds.y), ("val", ds.x_val, ds.y_val)):
        table = per_class_oracle(y, model.predict(x).argmax(1), 3)
        assert row[f"{prefix}_f1"] == pytest.approx(table[:, 2].mean(), rel=1e-9)
        assert row[f"{prefix}_recall"] == pytest.approx(table[:, 1].mean(), rel=1e-9)
    with open(result.run_dir / "metrics.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "train_f1", "val_f1",
                      "train_recall", "val_recall", "learning_rate", "seconds"]
    s = result.summary
    assert s["val_f1"] == row["val_f1"] and s["final_train_f1"] == pytest.approx(row["train_f1"], rel=1e-9)


def test_regression_run_from_the_cli_shows_monitors_and_saves_by_a_metric(tmp_path):
    cfg = write(tmp_path / "reg.yaml", """\
seed: 0
data: {type: sine, samples: 200, noise: 0.1}
model: [{type: Linear, units: 16}, Tanh, {type: Linear, units: 1}]
loss: MSE
optimizer: {type: Adam, learning_rate: 0.01}
train:
  epochs: 30
  batch_size: 32
  validation_split: 0.25
  metrics: [mae, r2]
  monitor: val_r2
  early_stopping: {monitor: val_mae, patience: 4}
""")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    assert "loss " in r.out and " mae " in r.out and " val_r2 " in r.out
    run_dir = tmp_path / "runs" / r.out.strip().splitlines()[-1].split("/")[-1]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["best"]["monitor"] == "val_r2" and s["best"]["mode"] == "max"
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    best = max(rows, key=lambda row: float(row["val_r2"]))
    assert s["best"]["epoch"] == int(best["epoch"])
    kept = next(ln for ln in r.out.splitlines() if ln.startswith("kept epoch "))  # the closing line: best.npz's epoch
    assert kept.startswith(f"kept epoch {best['epoch']}/{len(rows)} (best val_r2)  ")
    assert f" val_mae {float(best['val_mae']):.4f}" in kept and f" val_r2 {float(best['val_r2']):.4f}" in kept


@pytest.mark.parametrize("metrics_spec, message", [
    (["mea"], "train.metrics[0]: unknown metric 'mea' (did you mean"),
    (["f1", "f1"], "train.metrics[1]: metric f1 is listed twice"),
    (["mae"], "train.metrics[0]: metric mae scores regression targets, but the loss SoftmaxCrossEntropy is a "
              "classification loss"),
    ([{"type": "top_k_accuracy", "k": 3}], "k = 3 counts every sample as a hit: the model scores 3 classes"),
    ([{"type": "f1", "average": "binary"}], "average: binary scores class 1 of two classes, but the model scores 3"),
    ("f1", "train.metrics: expected a list of metrics such as [mae]"),
])
def test_bad_metric_specs_are_config_errors_at_their_entry(tmp_path, metrics_spec, message):
    raw = json.loads(json.dumps(BASE))
    raw["train"]["metrics"] = metrics_spec
    with pytest.raises(ConfigError) as e:
        assemble(config_from_dict(raw))
    assert message in str(e.value)


@pytest.mark.parametrize("train, message", [
    ({"monitor": "val_f2"}, "train.monitor: monitor 'val_f2' is not a metric the run records (did you mean val_f1?)"),
    ({"early_stopping": {"monitor": "val_precision"}},
     "train.early_stopping.monitor: monitor 'val_precision': the run does not record precision; add precision to "
     "the list train.metrics"),
    ({"monitor": "val_f1", "validation_split": 0.0}, "monitor 'val_f1' needs validation data"),
])
def test_monitors_must_name_a_metric_the_run_records(train, message):
    raw = json.loads(json.dumps(BASE))
    raw["train"].update(train)
    with pytest.raises(ConfigError) as e:
        assemble(config_from_dict(raw))
    assert message in str(e.value)


def test_a_plugin_metric_is_recorded_and_monitored(tmp_path):
    plugin = write(tmp_path / "worst.py", '''\
import numpy as np
from dlrun.metrics import Metric
from dlrun.registry import metrics


@metrics.register()
class max_error(Metric):
    """max |z - y|: the worst error of the epoch."""

    task = "regression"
    mode = "min"

    def size(self):
        return 1

    def update(self, sums, z, y, loss):
        sums[0] = max(float(sums[0]), float(abs(z - y.reshape(z.shape)).max()))

    def result(self, sums):
        return float(sums[0])
''')
    cfg = write(tmp_path / "reg.yaml", f"""\
seed: 0
plugins: [{plugin}]
data: {{type: sine, samples: 100}}
model: [{{type: Linear, units: 1}}]
loss: MSE
optimizer: {{type: SGD, learning_rate: 0.1}}
train: {{epochs: 3, validation_split: 0.2, metrics: [max_error], monitor: val_max_error}}
""")
    try:
        result = run.train(load_config(cfg), tmp_path / "runs")
    finally:
        registry.metrics.unregister("max_error")
    row = result.history.last
    assert row["val_max_error"] > 0 and result.summary["best"]["monitor"] == "val_max_error"


SPIRAL_METRICS = "  metrics: [f1, {type: top_k_accuracy, k: 2}]\n"


@pytest.mark.slow
def test_an_interrupted_epoch_resumes_with_its_metric_sums(tmp_path):
    cfg = spiral_config(tmp_path, epochs=4, batch_size=16).read_text().replace(
        "validation_split: 0.25}", "validation_split: 0.25,\n  metrics: [f1, {type: top_k_accuracy, k: 2}]}")
    cfg = write(tmp_path / "m.yaml", cfg)
    straight = run.train(load_config(cfg), tmp_path / "a").run_dir
    with pytest.raises(Interrupted):
        run.train(load_config(cfg), tmp_path / "b", callbacks=[InterruptAt(3, 2)])
    (resumed,) = (tmp_path / "b").iterdir()
    run.resume(resumed, *run.resume_config(resumed))

    def rows(d):
        with open(d / "metrics.csv", newline="") as f:
            return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]
    assert rows(straight) == rows(resumed)
    assert rows(straight)[-1]["train_top_k_accuracy"] != ""


@pytest.mark.slow
def test_metrics_may_change_between_epochs_but_not_inside_one(tmp_path):
    cfg = spiral_config(tmp_path, epochs=2, batch_size=16)
    first = run.train(load_config(cfg), tmp_path / "runs").run_dir
    config, ckpt = run.resume_config(first, ["train.epochs=3", "train.metrics=[f1]"])
    run.resume(first, config, ckpt)
    with open(first / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["val_f1"] != "" for r in rows] == [False, False, True]
    assert all(r["val_accuracy"] != "" for r in rows)
    # stopped inside epoch 4 with f1: the sums of its batches done cannot give recall
    with pytest.raises(Interrupted):
        run.resume(first, *run.resume_config(first, ["train.epochs=5"]), callbacks=[InterruptAt(4, 2)])
    with pytest.raises(CheckpointError, match=re.escape("with train.metrics f1(average='macro'); the resumed config "
                                                        "records recall(average='macro')")):
        run.resume(first, *run.resume_config(first, ["train.epochs=5", "train.metrics=[recall]"]))
    # the same metric with another option computes another thing: refused too
    with pytest.raises(CheckpointError, match=re.escape("records f1(average='weighted')")):
        run.resume(first, *run.resume_config(first, ["train.epochs=5", "train.metrics=[{type: f1, average: weighted}]"]))
    # the same metric written another way (its default given) continues the epoch
    run.resume(first, *run.resume_config(first, ["train.epochs=5", "train.metrics=[{type: f1, average: macro}]"]))


def test_evaluate_reports_the_run_s_metrics_as_training_recorded_them(tmp_path):
    raw = json.loads(json.dumps(BASE))
    raw["train"]["metrics"] = [{"type": "top_k_accuracy", "k": 2}, "f1"]
    result = run.train(config_from_dict(raw), tmp_path)
    r = run_cli("evaluate", result.run_dir / "checkpoints" / "last.npz", "--json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    row = result.history.last
    assert report["metrics"] == pytest.approx({"top_k_accuracy": row["val_top_k_accuracy"], "f1": row["val_f1"]},
                                              rel=1e-12)
    assert report["metrics"]["f1"] == pytest.approx(report["macro"]["f1"], rel=1e-12)  # two computations agree
    text = run_cli("evaluate", result.run_dir / "checkpoints" / "last.npz").out
    assert f"train.metrics: top_k_accuracy {row['val_top_k_accuracy']:.4f}  f1 {row['val_f1']:.4f}" in text


BROKEN = {
    "taken": ('@metrics.register("loss")', 'task = "classification"', "mode = 'min'", "",
              "metric 'loss' does not follow the metric contract: the name 'loss' is taken"),
    "mode": ("@metrics.register()", 'task = "classification"', "mode = 'minimise'", "",
             "set its mode to 'min' (lower is better) or 'max' (a class attribute), got 'minimise'"),
    "task": ("@metrics.register()", 'task = "segmentation"', "mode = 'min'", "",
             "set its task to 'classification' or 'regression' (a class attribute), got 'segmentation'"),
    "no-size": ("@metrics.register()", 'task = "classification"', "mode = 'min'", "nosize",
                "does not implement size"),
    "no-mode": ("@metrics.register()", 'task = "classification"', "", "",
                "set its mode to 'min' (lower is better) or 'max' (a class attribute), got None"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_plugin_metric_that_breaks_the_contract_is_refused_when_loaded(tmp_path, case):
    deco, task, mode, drop, message = BROKEN[case]
    size = "" if drop else "    def size(self):\n        return 1\n"
    plugin = write(tmp_path / "bad.py", f"""\
from dlrun.metrics import Metric
from dlrun.registry import metrics


{deco}
class broken(Metric):
    {task}
    {mode}

{size}
    def update(self, sums, z, y, loss):
        sums[0] += 1

    def result(self, sums):
        return float(sums[0])
""")
    r = run_cli("train", spiral_config(tmp_path), "--plugin", plugin, "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert message in r.err and "bad.py:" in r.err


@pytest.mark.parametrize("method, returns, message", [
    ("result", "sums", "result returned an array of shape (1,); expected a number"),
    ("result", "'good'", "result returned 'good'; expected a number"),
    ("size", "'2'", "size() returned '2'; expected a positive int"),
])
def test_a_plugin_metric_returning_the_wrong_thing_is_named(tmp_path, method, returns, message):
    body = {"size": "1", "result": "float(sums[0])", method: returns}
    plugin = write(tmp_path / "odd.py", f"""\
from dlrun.metrics import Metric
from dlrun.registry import metrics


@metrics.register()
class odd(Metric):
    task, mode = "classification", "max"

    def size(self):
        return {body['size']}

    def update(self, sums, z, y, loss):
        sums[0] += 1

    def result(self, sums):
        return {body['result']}
""")
    cfg = write(tmp_path / "c.yaml", spiral_config(tmp_path).read_text().replace(
        "validation_split: 0.25}", "validation_split: 0.25, metrics: [odd]}"))
    for command in (["train", "--runs-dir", tmp_path / "runs"], ["check"]):
        r = run_cli(*command, cfg, "--plugin", plugin)
        assert r.code == 2 and r.err.count("\n") == 1, (command, r.err)
        assert f"the metric odd(): {message}" in r.err, (command, r.err)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_resume_error_in_a_recorded_key_names_the_checkpoint_not_another_set(tmp_path):
    """The recorded config has no file lines: a problem in a key no --set touched was placed at
    whichever --set came first (--set train.epochs=5 was blamed for the monitor below)."""
    raw = json.loads(json.dumps(BASE))
    raw["train"].update({"early_stopping": {"monitor": "val_f1", "patience": 9}, "metrics": ["f1"]})
    first = run.train(config_from_dict(raw), tmp_path).run_dir
    r = run_cli("train", "--resume", first, "--set", "train.epochs=5", "--set", "train.metrics=[precision]")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert r.err.startswith(f"error: {first / 'checkpoints' / 'last.npz'}: train.early_stopping.monitor: monitor "
                            f"'val_f1': the run does not record f1"), r.err


def test_the_plugin_metric_in_the_docs_works_as_written(tmp_path):
    """docs/training.md's max_error example, copied from the page: registered, recorded, monitored,
    and its val_ value the largest |z - y| of the final model on the validation data."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    code = re.search(r"```python\n(.*?)```", page[page.index("Your own metric is a plugin class"):], re.S).group(1)
    plugin = write(tmp_path / "max_error.py", code)
    cfg = write(tmp_path / "reg.yaml", f"""\
seed: 0
plugins: [{plugin}]
data: {{type: sine, samples: 200}}
model: [{{type: Linear, units: 16}}, Tanh, {{type: Linear, units: 1}}]
loss: MSE
optimizer: {{type: Adam, learning_rate: 0.01}}
train: {{epochs: 3, validation_split: 0.2, metrics: [max_error, mae], monitor: val_max_error}}
""")
    try:
        result = run.train(load_config(cfg), tmp_path / "runs")
        ds = load_data(load_config(cfg))
    finally:
        registry.metrics.unregister("max_error")
    z = result.trainer.model.predict(ds.x_val)
    want = np.abs(z - ds.y_val.reshape(z.shape).astype(np.float32)).max()
    assert result.history.last["val_max_error"] == pytest.approx(float(want), rel=1e-6)
    assert result.summary["best"]["monitor"] == "val_max_error" and result.summary["best"]["mode"] == "min"


def test_a_metric_recorded_twice_under_names_of_its_own(tmp_path):
    """Keras' name=: macro and weighted F1 side by side, monitored by their names in their own
    direction (a named metric is not in the registry, so its mode comes from the metric)."""
    from dlrun.training.controls import EarlyStopping, LearningRateScheduler

    raw = json.loads(json.dumps(BASE))
    raw["train"].update({"metrics": ["f1", {"type": "f1", "average": "weighted", "name": "f1_weighted"}],
                         "early_stopping": {"monitor": "val_f1_weighted", "patience": 9},
                         "schedule": {"type": "reduce_on_plateau", "monitor": "val_f1_weighted"}})
    config = config_from_dict(raw)
    a = assemble(config)
    ds, trainer, controls = a.data, a.trainer, a.controls
    assert trainer.tracker.names == ("f1", "f1_weighted") and trainer.tracker.modes["f1_weighted"] == "max"
    assert next(c for c in controls if isinstance(c, EarlyStopping)).mode == "max"
    assert next(c for c in controls if isinstance(c, LearningRateScheduler)).schedule.mode == "max"
    result = run.train(config_from_dict(raw), tmp_path)
    row = result.history.last
    table = per_class_oracle(ds.y_val, result.trainer.model.predict(ds.x_val).argmax(1), 3)
    assert row["val_f1_weighted"] == pytest.approx((table[:, 2] * table[:, 3]).sum() / table[:, 3].sum(), rel=1e-9)
    assert row["val_f1"] == pytest.approx(table[:, 2].mean(), rel=1e-9)
    assert result.summary["best"] == {**result.summary["best"], "monitor": "val_f1_weighted", "mode": "max"}


@pytest.mark.parametrize("entry, message", [
    ({"type": "f1", "name": "Weighted F1"}, "train.metrics[0].name: expected a name of lower-case letters"),
    ({"type": "f1", "name": "accuracy"}, "train.metrics[0].name: the name 'accuracy' is taken"),
    ({"type": "f1", "nmae": "x"}, "unknown option 'nmae' for metric f1 (did you mean name?)"),
])
def test_a_metric_name_that_cannot_name_columns_is_refused_with_the_config(entry, message):
    raw = json.loads(json.dumps(BASE))
    raw["train"]["metrics"] = [entry]
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)  # found with the config's other errors, before any data is read
    assert message in str(e.value)
