"""`dlrun evaluate` and the metrics behind it, against hand-computed confusion matrices."""
from __future__ import annotations

import json

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, read_csv, spiral_config, summary, train
from conftest import run_cli, write
from dlrun.metrics import averages, confusion_matrix, per_class, regression_metrics


def test_confusion_matrix_and_per_class_metrics_by_hand():
    y_true = [0, 0, 1, 1, 2, 2, 2, 3]
    y_pred = [0, 1, 1, 1, 2, 0, 2, 2]
    cm = confusion_matrix(y_true, y_pred, 4)
    assert cm.tolist() == [[1, 1, 0, 0],
                           [0, 2, 0, 0],
                           [1, 0, 2, 0],
                           [0, 0, 1, 0]]
    m = per_class(cm)
    # class 0: tp 1, predicted 2, true 2; class 1: tp 2, predicted 3, true 2;
    # class 2: tp 2, predicted 3, true 3; class 3: never predicted, never right -> 0
    assert m["precision"].tolist() == pytest.approx([1 / 2, 2 / 3, 2 / 3, 0.0])
    assert m["recall"].tolist() == pytest.approx([1 / 2, 1.0, 2 / 3, 0.0])
    assert m["f1"].tolist() == pytest.approx([0.5, 0.8, 2 / 3, 0.0])
    assert m["support"].tolist() == [2, 2, 3, 1]


def test_macro_and_weighted_averages_by_hand():
    cm = confusion_matrix([0, 0, 1, 1, 2, 2, 2, 3], [0, 1, 1, 1, 2, 0, 2, 2], 4)
    avg = averages(cm, per_class(cm))  # per class as above: P (1/2, 2/3, 2/3, 0), R (1/2, 1, 2/3, 0), support (2, 2, 3, 1)
    assert avg["macro"]["precision"] == pytest.approx((1 / 2 + 2 / 3 + 2 / 3 + 0) / 4)
    assert avg["macro"]["f1"] == pytest.approx((0.5 + 0.8 + 2 / 3 + 0) / 4)
    assert avg["weighted"]["recall"] == pytest.approx((2 * 0.5 + 2 * 1 + 3 * 2 / 3 + 0) / 8)  # = accuracy
    assert avg["weighted"]["precision"] == pytest.approx((2 * 0.5 + 2 * 2 / 3 + 3 * 2 / 3) / 8)
    # a fifth class the model scores but no label or prediction names is left out of the macro
    # average (scikit-learn's labels = those in y_true or y_pred), not counted as a 0
    cm5 = confusion_matrix([0, 0, 1, 1, 2, 2, 2, 3], [0, 1, 1, 1, 2, 0, 2, 2], 5)
    assert averages(cm5, per_class(cm5)) == avg


def test_regression_metrics_by_hand():
    y = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [6.0, 0.0]])
    p = np.array([[1.5, 0.0], [2.0, 0.0], [2.0, 0.0], [6.0, 0.0]])
    m = regression_metrics(y, p)
    # errors 0.5, 0, −1, 0 in the first output, none in the second: 8 values in all
    assert m["mse"] == pytest.approx(1.25 / 8) and m["rmse"] == pytest.approx(np.sqrt(1.25 / 8))
    assert m["mae"] == pytest.approx(1.5 / 8)
    # output 0: SS_res 1.25, SS_tot (−2)² + (−1)² + 0² + 3² = 14; output 1 is constant and exact: R² = 1
    assert m["r2"] == pytest.approx(((1 - 1.25 / 14) + 1.0) / 2)
    p[0, 1] = 0.5  # a constant output predicted inexactly scores 0
    assert regression_metrics(y, p)["r2"] == pytest.approx((1 - 1.25 / 14) / 2)
    flat = regression_metrics(y[:, 0], p[:, :1])  # (N,) targets against (N, 1) outputs
    assert flat["r2"] == pytest.approx(1 - 1.25 / 14) and flat["mae"] == pytest.approx(1.5 / 4)


def test_evaluate_a_regression_run_reports_its_errors_against_predictions(tmp_path):
    data = tmp_path / "reg.csv"
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (60, 2))
    np.savetxt(data, np.c_[x, x @ [1.5, -2.0] + 0.3], delimiter=",", fmt="%.17g")
    cfg = write(tmp_path / "reg.yaml", f"""\
name: reg
data: {{type: file, path: {data}, task: regression}}
model: [{{type: Linear, units: 1}}]
loss: MSE
optimizer: {{type: SGD, learning_rate: 0.1}}
train: {{epochs: 5, batch_size: 20}}
""")
    run = train(cfg, tmp_path / "runs")
    r = run_cli("evaluate", run, "--data", data, "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", fmt="%.17g")
    pred = read_csv(run_cli("predict", run, "--input", tmp_path / "x.csv").out)[1][:, 0]
    err = pred - (x @ [1.5, -2.0] + 0.3)
    assert res["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-5)
    assert res["loss"] == pytest.approx(res["mse"], rel=1e-6) == pytest.approx(np.square(err).mean(), rel=1e-5)
    y = x @ [1.5, -2.0] + 0.3
    assert res["r2"] == pytest.approx(1 - np.square(err).sum() / np.square(y - y.mean()).sum(), rel=1e-5)
    assert res["confusion"] is None and res["macro"] is None
    r = run_cli("evaluate", run)
    assert r.code == 0 and "rmse" in r.out and "r2" in r.out


def test_evaluate_a_binary_cross_entropy_run_scores_two_classes_from_one_logit(tmp_path):
    """One logit per sample: labels 0 and 1, predicted 1 where z > 0 (it reported label 1 as
    outside the model's 1 class, exit 2)."""
    cfg = write(tmp_path / "bce.yaml", """\
name: bce
seed: 1
data: {type: moons, samples: 80, noise: 0.1}
model: [{type: Linear, units: 8}, ReLU, {type: Linear, units: 1}]
loss: BinaryCrossEntropy
optimizer: {type: Adam, learning_rate: 0.05}
train: {epochs: 10, batch_size: 16, validation_split: 0.25}
""")
    run = train(cfg, tmp_path / "runs")
    r = run_cli("evaluate", run, "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    cm = np.array(res["confusion"])
    assert cm.shape == (2, 2) and cm.sum() == 20 and cm.sum(axis=1).tolist() == [10, 10]
    assert res["accuracy"] == pytest.approx(np.trace(cm) / 20)
    row = next(m for m in metrics_rows(run) if int(m["epoch"]) == summary(run)["best"]["epoch"])
    assert res["accuracy"] == float(row["val_accuracy"])  # the same z > 0 rule as training's accuracy


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evaluate")
    return train(spiral_config(tmp, epochs=6), tmp / "runs")


def test_evaluate_on_validation_data_reproduces_the_best_epoch(run_dir):
    r = run_cli("evaluate", run_dir, "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    best = summary(run_dir)["best"]
    row = next(m for m in metrics_rows(run_dir) if int(m["epoch"]) == best["epoch"])
    assert res["checkpoint"].endswith("best.npz") and res["samples"] == 30
    assert res["loss"] == float(row["val_loss"]) == best["value"]
    assert res["accuracy"] == float(row["val_accuracy"])
    cm = np.array(res["confusion"])
    assert cm.sum() == 30 and np.trace(cm) / 30 == res["accuracy"]
    r = run_cli("evaluate", run_dir)
    assert r.code == 0, r.err
    assert "precision" in r.out and "confusion matrix" in r.out and "validation split" in r.out
    assert "macro avg" in r.out and "weighted avg" in r.out
    assert res["weighted"]["recall"] == pytest.approx(res["accuracy"])  # support-weighted recall is accuracy


def test_evaluate_on_a_file_matches_predictions_counted_by_hand(run_dir, tmp_path):
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (25, 2))
    y = rng.integers(0, 3, 25)
    np.savetxt(tmp_path / "data.csv", np.c_[x, y], delimiter=",", header="a,b,label", comments="", fmt="%.17g")
    np.savetxt(tmp_path / "x.csv", x, delimiter=",", fmt="%.17g")
    r = run_cli("predict", run_dir, "--input", tmp_path / "x.csv")
    assert r.code == 0, r.err
    pred = read_csv(r.out)[1][:, 0].astype(int)
    expect = [[sum(1 for t, p in zip(y, pred) if t == i and p == j) for j in range(3)] for i in range(3)]
    r = run_cli("evaluate", run_dir, "--data", tmp_path / "data.csv", "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    assert res["confusion"] == expect
    assert res["accuracy"] == float(np.mean(pred == y))
    for k in range(3):
        tp = expect[k][k]
        col = sum(expect[i][k] for i in range(3))
        row = sum(expect[k])
        assert res["precision"][k] == pytest.approx(tp / col if col else 0.0)
        assert res["recall"][k] == pytest.approx(tp / row if row else 0.0)


@pytest.mark.slow
def test_evaluate_on_a_generator_spec_and_bad_data(run_dir):
    r = run_cli("evaluate", run_dir, "--data", "{type: spiral, classes: 3, points_per_class: 10, seed: 9}", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["samples"] == 30
    r = run_cli("evaluate", run_dir, "--data", "{type: spiral, classes: 5, points_per_class: 4}")
    assert r.code == 2 and "label 3 is out of range: the model outputs 3 scores" in r.err, r.err
    r = run_cli("evaluate", run_dir, "--data", "no_such_thing")
    assert r.code == 2 and "no such file" in r.err


def test_evaluate_names_the_file_line_of_a_label_the_model_has_no_output_for(run_dir, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,label\n0.1,0.2,0\n0.3,0.4,5\n")
    r = run_cli("evaluate", run_dir, "--data", bad)
    assert r.code == 2 and f"{bad}:3: label 5 is out of range" in r.err, r.err
