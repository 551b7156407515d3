"""`dlrun evaluate` and the metrics behind it, against hand-computed confusion matrices."""
from __future__ import annotations

import json

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, read_csv, spiral_config, summary, train
from conftest import run_cli
from dlrun.metrics import confusion_matrix, per_class


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
