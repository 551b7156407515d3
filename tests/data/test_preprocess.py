"""data.preprocess: fitted on the training split only, applied to every part, saved as plain JSON."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, write
from dlrun.config import config_from_dict, load_config
from dlrun.data import load_data
from dlrun.data.preprocess import Preprocessing, Settings, fit
from dlrun.data.table import Table
from dlrun.errors import ConfigError, DataError

CONFIG = """\
seed: 0
data:
  type: file
  path: {path}
  target: y
  categorical: [colour]
  preprocess: {preprocess}
model:
  - {{type: Linear, units: 2}}
loss: SoftmaxCrossEntropy
optimizer: {{type: SGD, learning_rate: 0.1}}
train: {{epochs: 1, batch_size: 8, validation_split: 0.25}}
"""


def _table_csv(path, n=40, seed=0):
    rng = np.random.default_rng(seed)
    income = np.round(rng.normal(50_000, 9_000, n))
    ratio = np.round(rng.uniform(0.1, 0.6, n), 3)
    colour = rng.choice(["red", "green", "blue"], n)
    y = np.where(ratio < 0.35, "yes", "no")
    lines = ["income,ratio,colour,y"] + [f"{a:.0f},{b},{c},{d}" for a, b, c, d in zip(income, ratio, colour, y)]
    write(path, "\n".join(lines) + "\n")
    return income, ratio, colour, y


def _load(tmp_path, preprocess="{numeric: standardize}", **kw):
    raw = _table_csv(tmp_path / "t.csv", **kw)
    cfg = load_config(write(tmp_path / "c.yaml", CONFIG.format(path="t.csv", preprocess=preprocess)))
    return raw, load_data(cfg)


def test_statistics_come_from_the_training_split_only(tmp_path):
    (income, ratio, colour, y), ds = _load(tmp_path)
    keep, held = ds.samples, ds.samples_val
    assert len(held) == 10 and not np.isin(held, keep).any()
    p = ds.preprocess
    np.testing.assert_allclose(p.offset, [income[keep].mean(), ratio[keep].mean()], rtol=1e-12)
    np.testing.assert_allclose(p.scale, [income[keep].std(), ratio[keep].std()], rtol=1e-12)
    assert abs(p.offset[0] - income.mean()) > 1e-6  # (all rows would give another mean)
    # the validation part is transformed with the training statistics, not its own
    np.testing.assert_allclose(ds.x_val[:, 0], (income[held] - income[keep].mean()) / income[keep].std(), rtol=1e-12)
    assert abs(ds.x_val[:, 0].mean()) > 1e-3
    # one-hot columns in the column's place, categories sorted: blue, green, red
    assert p.output_names == ["income", "ratio", "colour=blue", "colour=green", "colour=red"]
    np.testing.assert_array_equal(ds.x[:, 2:], (colour[keep][:, None] == np.array(["blue", "green", "red"])).astype(float))
    assert ds.classes == ["no", "yes"]
    np.testing.assert_array_equal(ds.y, (y[keep] == "yes").astype(int))


def test_a_category_seen_only_in_validation_is_refused_with_its_row(tmp_path):
    _table_csv(tmp_path / "t.csv")
    text = (tmp_path / "t.csv").read_text().splitlines()
    cfg = load_config(write(tmp_path / "c.yaml", CONFIG.format(path="t.csv", preprocess="{numeric: minmax}")))
    held = load_data(cfg).samples_val
    line = int(held[0]) + 2  # (header is line 1)
    parts = text[line - 1].split(",")
    parts[2] = "violet"
    text[line - 1] = ",".join(parts)
    write(tmp_path / "t.csv", "\n".join(text) + "\n")
    with pytest.raises(DataError, match=rf"t\.csv:{line}: column 'colour': category 'violet' was not seen in training"):
        load_data(cfg)


def test_record_is_plain_json_and_gives_the_same_transform(tmp_path):
    _, ds = _load(tmp_path, "{numeric: minmax, categorical: index, missing: median}")
    rec = json.loads(json.dumps(ds.preprocess.record()))
    back = Preprocessing.from_record(rec, "x")
    t = Table(["income", "ratio", "colour"], [False, False, True], np.array([[40_000.0, np.nan], [61_000.0, 0.2]]),
              np.array([["green"], [""]]))
    a = ds.preprocess.transform(t, str)
    np.testing.assert_array_equal(back.transform(t, str), a)
    assert a[0, 1] == (back.fill[1] - back.offset[1]) / back.scale[1]  # the training median, scaled
    assert a[0, 2] == 1.0 and a[1, 2] == ["blue", "green", "red"].index(back.category_fill[0])
    with pytest.raises(ValueError, match="damaged"):
        Preprocessing.from_record({**rec, "offset": "x"}, "x")


def test_minmax_over_all_values_and_constant_features():
    x = np.array([[[0.0, 4.0], [8.0, 16.0]], [[0.0, 2.0], [6.0, 12.0]]])
    p = fit(Settings(numeric="minmax", per_feature=False), x, str)
    np.testing.assert_array_equal(p.transform(x, str), x / 16.0)
    q = fit(Settings(numeric="standardize"), x, str)
    assert q.scale[0, 0] == 1.0  # a constant feature is shifted, not divided by 0
    np.testing.assert_array_equal(q.transform(x, str)[:, 0, 0], [0.0, 0.0])


def test_missing_values_are_refused_by_default_and_filled_from_training_when_asked():
    x = np.array([[1.0, 2.0], [np.nan, 4.0], [5.0, 6.0]])
    with pytest.raises(DataError, match=r"row 2: feature 1: a missing value \(NaN"):
        fit(Settings(), x, lambda i: f"row {i + 1}")
    p = fit(Settings(missing="mean"), x, str)
    np.testing.assert_array_equal(p.transform(x, str)[1], [3.0, 4.0])


def test_the_digits_scaling_moved_to_preprocess_gives_the_same_inputs(tmp_path):
    old = load_data(config_from_dict({"seed": 0, "data": {"type": "digits", "flatten": True},
                                      "model": [{"type": "Linear", "units": 10}], "loss": "SoftmaxCrossEntropy",
                                      "optimizer": "SGD", "train": {"validation_split": 0.2}}))
    new = load_data(load_config(ROOT / "configs/digits_mlp.yaml"))
    np.testing.assert_array_equal(old.x, new.x)
    np.testing.assert_array_equal(old.x_val, new.x_val)


def test_replaced_loader_options_are_refused_in_a_config_and_kept_in_a_checkpoints():
    spec = {"seed": 0, "data": {"type": "iris", "standardize": True}, "model": [{"type": "Linear", "units": 3}],
            "loss": "SoftmaxCrossEntropy", "optimizer": "SGD", "train": {"validation_split": 0.2}}
    with pytest.raises(ConfigError, match=r"data.standardize: replaced by preprocess: \{numeric: standardize\}"):
        config_from_dict(spec)
    ds = load_data(config_from_dict(spec, from_checkpoint=True))
    assert abs(ds.x.mean()) < 0.2  # scaled over all rows, as such runs were


def test_a_semicolon_file_reads_with_its_delimiter(tmp_path):
    write(tmp_path / "s.csv", "a;b;label\n0,1;2;yes\n3;4;no\n5;6;yes\n7;8;no\n")
    cfg = CONFIG.format(path="s.csv", preprocess="{}").replace("target: y\n  categorical: [colour]\n",
                                                                 "target: label\n  delimiter: ';'\n")
    with pytest.raises(DataError, match=r"s\.csv:2: column 1: expected a number, got '0,1'"):
        load_data(load_config(write(tmp_path / "c.yaml", cfg)))
    write(tmp_path / "s.csv", "a;b;label\n0.1;2;yes\n3;4;no\n5;6;yes\n7;8;no\n")
    ds = load_data(load_config(write(tmp_path / "c.yaml", cfg)))
    assert ds.columns == ["a", "b"] and ds.classes == ["no", "yes"]
