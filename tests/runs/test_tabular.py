"""Raw tabular data end to end: the run's preprocessing applied by predict, evaluate and --resume,
class names in and out, and the warnings that catch unscaled data."""
from __future__ import annotations

import csv
import importlib.util
import json

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, train
from conftest import CONFIGS, ROOT, run_cli, write
from dlrun.data import split
from dlrun.data.datasets import iris
from dlrun.config import config_from_dict
from dlrun.runs import checkpoint
from dlrun.runs.run import train as train_in_process

LOANS = ROOT / "configs/data/loans.csv"


def _rows(text: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(text.splitlines()))
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def iris_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iris")
    return train(CONFIGS / "iris.yaml", tmp / "runs", "--set", "train.epochs=30"), tmp


@pytest.mark.slow
def test_setosa_from_raw_measurements_comes_back_setosa_with_the_models_probability(iris_run):
    run, tmp = iris_run
    write(tmp / "new.csv", "5.1,3.5,1.4,0.2\n")
    r = run_cli("predict", run, "--input", tmp / "new.csv", "--proba")
    assert r.code == 0, r.err
    cols, rows = _rows(r.out)
    assert cols == ["prediction", "proba_setosa", "proba_versicolor", "proba_virginica"]
    assert rows[0][0] == "setosa"
    # an independent forward pass: standardized with the training split's statistics, in float64
    ds = iris()
    keep = split(np.arange(150), ds.y, 0.2, 0)[0]
    mean, std = ds.x[keep].mean(axis=0), ds.x[keep].std(axis=0)
    x = (np.array([5.1, 3.5, 1.4, 0.2]) - mean) / std
    a = checkpoint.read(checkpoint.resolve(run)).model
    h = np.maximum(x @ a["0.weight"].astype(np.float64).T + a["0.bias"], 0.0)
    z = h @ a["2.weight"].astype(np.float64).T + a["2.bias"]
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    np.testing.assert_allclose([float(v) for v in rows[0][1:]], p, rtol=1e-5)
    assert p[0] > 0.9


@pytest.mark.slow
def test_evaluate_on_raw_data_equals_the_runs_own_validation_figures(iris_run):
    run, tmp = iris_run
    last = metrics_rows(run)[-1]
    r = run_cli("evaluate", run / "checkpoints/last.npz", "--json")
    assert r.code == 0, r.err
    own = json.loads(r.out)
    assert own["loss"] == pytest.approx(float(last["val_loss"]), rel=1e-6)
    assert own["accuracy"] == pytest.approx(float(last["val_accuracy"]), abs=1e-9)
    assert own["classes"] == ["setosa", "versicolor", "virginica"]
    # the same 30 flowers as a raw CSV, species by name
    ds = iris()
    held = split(np.arange(150), ds.y, 0.2, 0)[2]
    names = np.array(ds.classes)[ds.y[held]]
    write(tmp / "val.csv", "sepal_length,sepal_width,petal_length,petal_width,species\n"
          + "".join(f"{','.join(f'{v:g}' for v in ds.x[i])},{n}\n" for i, n in zip(held, names)))
    r = run_cli("evaluate", run / "checkpoints/last.npz", "--data", tmp / "val.csv", "--json")
    assert r.code == 0, r.err
    raw = json.loads(r.out)
    assert raw["loss"] == pytest.approx(own["loss"], rel=1e-12) and raw["confusion"] == own["confusion"]
    r = run_cli("evaluate", run / "checkpoints/last.npz")
    assert "┃ true \\ pred ┃ setosa ┃ versicolor ┃ virginica ┃" in r.out


def _loans_config(tmp, preprocess: bool, epochs=12):
    text = (CONFIGS / "loans.yaml").read_text().replace("path: data/loans.csv", f"path: {LOANS}")
    text = text.replace("epochs: 30", f"epochs: {epochs}")
    if not preprocess:  # the new user's config: the columns named, nothing scaled, missing incomes filled
        text = text.replace("numeric: standardize", "numeric: none")
    return write(tmp / ("loans.yaml" if preprocess else "loans_raw.yaml"), text)


@pytest.mark.slow
def test_unscaled_loans_are_warned_of_and_preprocessing_fixes_them(tmp_path):
    raw = _loans_config(tmp_path, preprocess=False)
    r = run_cli("check", raw)
    assert r.code == 0, r.err
    assert "features differ in scale by 5 orders of magnitude ('income' up to" in r.err
    assert "add data.preprocess: {numeric: standardize}" in r.err
    assert "times chance level (log 2 = 0.693 for 2 classes)" in r.err
    r = run_cli("train", raw, "--runs-dir", tmp_path / "runs")
    assert r.code == 0 and "features differ in scale" in r.err and "times chance level" in r.err
    fixed = _loans_config(tmp_path, preprocess=True)
    r = run_cli("check", fixed)
    assert r.code == 0 and "warning" not in r.err, r.err
    assert ("preprocess (fitted on the training samples): 3 numeric features standardize; one_hot employment (3), "
            "region (4); missing values: mean; classes no, yes") in r.out
    run = train(fixed, tmp_path / "runs")
    scaled = json.loads((run / "summary.json").read_text())
    assert scaled["val_accuracy"] > 0.78  # the generating rule itself scores 0.82 on the file
    r = run_cli("predict", run, "--input", ROOT / "configs/data/loans_new.csv", "--proba")
    assert r.code == 0, r.err
    cols, rows = _rows(r.out)
    assert cols == ["prediction", "proba_no", "proba_yes"]
    assert [row[0] for row in rows[:2]] == ["yes", "no"]  # a strong and a weak applicant
    # the training CSV itself, label column and all, predicts by the header's names
    r = run_cli("predict", run, "--input", LOANS)
    assert r.code == 0 and len(_rows(r.out)[1]) == 2000


@pytest.mark.slow
def test_resume_applies_the_saved_preprocessing_and_equals_a_straight_run(tmp_path):
    cfg = _loans_config(tmp_path, preprocess=True, epochs=4)
    straight = train(cfg, tmp_path / "a")
    part = train(cfg, tmp_path / "b", "--set", "train.epochs=2")
    meta = checkpoint.read(part / "checkpoints/last.npz").meta
    assert meta["preprocess"]["columns"] == ["income", "credit_score", "debt_ratio", "employment", "region"]
    assert meta["preprocess"]["classes"] == ["no", "yes"]
    r = run_cli("train", "--resume", part, "--set", "train.epochs=4")
    assert r.code == 0, r.err
    assert metrics_rows(part) == metrics_rows(straight)


@pytest.mark.slow
def test_init_from_with_another_split_warns_when_validation_samples_were_trained_on(tmp_path):
    cfg = write(tmp_path / "s.yaml", (CONFIGS / "iris.yaml").read_text().replace("epochs: 100", "epochs: 2"))
    base = train(cfg, tmp_path / "runs")
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--init-from", base, "--seed", "5")
    assert r.code == 0, r.err
    assert f"--init-from {base}/checkpoints/best.npz: its run had other split seed" in r.err
    assert "of this run's 30 validation samples were among its training samples" in r.err
    r = run_cli("train", cfg, "--runs-dir", tmp_path / "runs", "--init-from", base)
    assert r.code == 0 and "warning" not in r.err, r.err


def test_a_resume_that_changes_the_preprocessing_is_refused(tmp_path):
    cfg = write(tmp_path / "i.yaml", (CONFIGS / "iris.yaml").read_text().replace("epochs: 100", "epochs: 1"))
    run = train(cfg, tmp_path / "runs")
    r = run_cli("train", "--resume", run, "--set", "train.epochs=2", "--set", "data.preprocess.numeric=minmax")
    assert r.code == 2, r.err
    assert "last.npz: data.preprocess: the run preprocessed" in r.err.replace(" (recorded config)", "")
    assert ("the run preprocessed its data with {numeric: standardize, categorical: one_hot, missing: refuse, "
            "per_feature: true}, this resume asks for {numeric: minmax,") in r.err


def test_a_misspelt_preprocess_key_is_named_with_a_suggestion(tmp_path):
    r = run_cli("check", CONFIGS / "iris.yaml", "--set", "data.preprocessing={numeric: standardize}")
    assert r.code == 2 and "unknown option 'preprocessing' for data generator iris (did you mean preprocess?)" in r.err
    r = run_cli("check", CONFIGS / "iris.yaml", "--set", "data.preprocess.numerics=minmax")
    assert r.code == 2 and "data.preprocess.numerics: unknown key 'numerics' (did you mean numeric?)" in r.err


@pytest.mark.slow
def test_init_from_a_run_on_other_data_compares_the_rows_themselves(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 2))
    y = (x[:, 0] > 0).astype(int)
    rows = [f"{a:.6f},{b:.6f},{c}\n" for (a, b), c in zip(x, y)]
    write(tmp_path / "a.csv", "".join(rows))
    write(tmp_path / "b.csv", "".join(rows[::-1]))  # the same samples in another order: another data file
    text = ("seed: 0\ndata: {type: file, path: %s}\nmodel:\n  - {type: Linear, units: 2}\nloss: SoftmaxCrossEntropy\n"
            "optimizer: {type: SGD, learning_rate: 0.1}\ntrain: {epochs: 1, batch_size: 8, validation_split: 0.25}\n")
    base = train(write(tmp_path / "a.yaml", text % "a.csv"), tmp_path / "runs")
    r = run_cli("train", write(tmp_path / "b.yaml", text % "b.csv"), "--runs-dir", tmp_path / "runs", "--init-from", base)
    assert r.code == 0, r.err
    assert "its run had other data, and" in r.err and "of this run's 15 validation samples were among its training" in r.err


def test_gradcheck_of_a_tabular_config_checks_the_model_on_its_preprocessed_inputs():
    r = run_cli("gradcheck", CONFIGS / "loans.yaml", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["result"] == "PASS"


def test_the_shipped_loans_follow_the_rule_their_script_states():
    """configs/data/loans.csv: the rule in make_loans.py, plus logistic noise, decides the labels
    (docs/tabular.md: the rule agrees with 0.82 of them); about 3% of the incomes are empty."""
    spec = importlib.util.spec_from_file_location("make_loans", ROOT / "configs/data/make_loans.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    with open(LOANS, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == make.ROWS
    has = np.array([r["income"] != "" for r in rows])
    assert abs((~has).mean() - 0.03) < 0.005
    col = lambda k: np.array([r[k] for r in rows])  # noqa: E731
    z = make.rule(np.where(has, col("income"), "1").astype(float), col("credit_score").astype(float),
                  col("debt_ratio").astype(float), col("employment"))
    agree = ((z > 0) == (col("approved") == "yes"))[has].mean()
    assert round(agree, 2) == 0.82


@pytest.mark.slow
def test_an_old_standardized_iris_run_keeps_its_meaning_and_evaluate_warns_of_raw_iris(tmp_path):
    """A checkpoint from before data.preprocess (iris' standardize: true, no meta.preprocess)."""
    spec = {"seed": 0, "data": {"type": "iris", "standardize": True},
            "model": [{"type": "Linear", "units": 8}, "ReLU", {"type": "Linear", "units": 3}],
            "loss": "SoftmaxCrossEntropy", "optimizer": {"type": "Adam", "learning_rate": 0.05},
            "train": {"epochs": 15, "batch_size": 16, "validation_split": 0.2}}
    result = train_in_process(config_from_dict(spec, from_checkpoint=True), tmp_path / "runs")
    path = result.run_dir / "checkpoints/last.npz"
    model, optim, meta = checkpoint.load(path)
    del meta["preprocess"]  # (as such runs were written)
    checkpoint.save(path, model, optim, meta)
    r = run_cli("predict", path, "--input", write(tmp_path / "x.csv", "0.1,0.2,0.3,0.4\n"))
    assert r.code == 0 and r.out.splitlines()[0] == "prediction" and r.out.splitlines()[1] in "012"  # indices, as before
    raw = run_cli("evaluate", path, "--data", "iris", "--json")
    assert raw.code == 0, raw.err
    assert ("--data iris: the run's data was {type: iris, standardize: true}, which its model takes; this is "
            "{type: iris} without it") in raw.err
    same = run_cli("evaluate", path, "--data", "{type: iris, standardize: true}", "--json")
    assert same.code == 0 and "warning" not in same.err
    assert json.loads(same.out)["accuracy"] > json.loads(raw.out)["accuracy"]
    own = run_cli("evaluate", path, "--json")
    assert json.loads(own.out)["loss"] == pytest.approx(result.summary["val_loss"], rel=1e-6)
