import pytest

from conftest import write
from dlrun.config import load_config
from dlrun.config.source import parse_yaml
from dlrun.errors import ConfigError, ConfigErrors, DlrunError

GOOD = """\
seed: 3
data: {type: spiral, classes: 3, points_per_class: 10}
model:
  - {type: Linear, units: 8}
  - ReLU
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 1e-1, momentum: 0.9}
train: {epochs: 2, batch_size: 16}
"""


def test_valid_config_and_scientific_floats(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", GOOD))
    assert cfg.seed == 3 and cfg.train.epochs == 2 and cfg.train.batch_size == 16
    assert cfg.raw["optimizer"]["learning_rate"] == pytest.approx(0.1)
    assert cfg.name == "c"


def test_errors_name_file_line_and_path(tmp_path):
    bad = GOOD.replace("units: 8", "units: ten").replace("momentum: 0.9", "momentum: 0.9, nesterv: true")
    p = write(tmp_path / "bad.yaml", bad)
    with pytest.raises(ConfigErrors) as e:
        load_config(p)
    text = str(e.value)
    assert f"{p}:4: model[0].units: expected a positive integer, got 'ten'" in text
    assert f"{p}:8: optimizer.nesterv: unknown option 'nesterv' for optimizer SGD (did you mean nesterov?)" in text


def test_unknown_top_level_and_train_keys(tmp_path):
    p = write(tmp_path / "c.yaml", GOOD + "optimiser: {}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'optimiser' \(did you mean optimizer\?\)"):
        load_config(p)
    p = write(tmp_path / "d.yaml", GOOD.replace("batch_size", "batchsize"))
    with pytest.raises(ConfigError, match=r"d.yaml:9: train.batchsize: unknown key 'batchsize' \(did you mean batch_size\?\)"):
        load_config(p)


def test_missing_sections_are_all_reported(tmp_path):
    p = write(tmp_path / "c.yaml", "seed: 1\n")
    with pytest.raises(ConfigErrors) as e:
        load_config(p)
    text = str(e.value)
    for key in ("data", "model", "loss", "optimizer"):
        assert f"missing required key '{key}'" in text


def test_yaml_syntax_error_has_line(tmp_path):
    p = write(tmp_path / "c.yaml", "model:\n  - {type: Linear\n")
    with pytest.raises(ConfigError, match=r"c.yaml:\d+: YAML syntax error"):
        load_config(p)


def test_duplicate_keys_are_errors():
    with pytest.raises(ConfigError, match=r"x.yaml:2: seed: duplicate key 'seed'"):
        parse_yaml("seed: 1\nseed: 2\n", "x.yaml")


def test_unsafe_tags_are_refused():
    with pytest.raises(ConfigError, match="YAML"):
        parse_yaml("seed: !!python/object/apply:os.system ['echo hi']\n", "x.yaml")


def test_set_overrides_are_typed_and_validated(tmp_path):
    p = write(tmp_path / "c.yaml", GOOD)
    cfg = load_config(p, ["train.epochs=5", "optimizer.learning_rate=0.5", "model[0].units=4", "model[1].type=Tanh"])
    assert cfg.train.epochs == 5 and cfg.raw["optimizer"]["learning_rate"] == 0.5
    assert cfg.raw["model"][0]["units"] == 4 and cfg.raw["model"][1] == {"type": "Tanh"}
    with pytest.raises(ConfigError, match=r"--set train.epochs=ten: train.epochs: expected a positive integer, got 'ten'"):
        load_config(p, ["train.epochs=ten"])
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(p, ["train.epochs"])
    with pytest.raises(ConfigError, match=r"model\[7\]: index 7 is out of range"):
        load_config(p, ["model[7].units=3"])
    # a section that --set created is located by that --set, also for a key filled in by default
    cfg = load_config(p, ["train.early_stopping.patience=3"])
    assert str(cfg.locate("train.early_stopping.monitor")) == \
        "--set train.early_stopping.patience=3: train.early_stopping.monitor"
    assert str(cfg.locate("train.epochs")).startswith(str(p))  # keys from the file keep their line


def test_seed_and_device_flags_override(tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", GOOD), seed=11, device="cpu")
    assert cfg.seed == 11 and cfg.device == "cpu"
    with pytest.raises(ConfigError, match="expected one of 'cpu', 'gpu', got 'tpu'"):
        load_config(write(tmp_path / "d.yaml", GOOD), device="tpu")


def test_data_path_is_relative_to_config(tmp_path):
    write(tmp_path / "sub" / "d.csv", "1,2,0\n3,4,1\n")
    p = write(tmp_path / "sub" / "c.yaml", GOOD.replace("{type: spiral, classes: 3, points_per_class: 10}",
                                                      "{type: file, path: d.csv}"))
    cfg = load_config(p)
    assert cfg.build("data").x.shape == (2, 2)


def test_yaml_aliases_are_copies_and_cannot_loop_or_explode(tmp_path):
    aliased = GOOD.replace("  - {type: Linear, units: 8}\n  - ReLU\n",
                           "  - &hidden {type: Linear, units: 8}\n  - ReLU\n  - *hidden\n  - ReLU\n")
    cfg = load_config(write(tmp_path / "a.yaml", aliased), ["model[0].units=5"])
    assert [s.get("units") for s in cfg.model if isinstance(s, dict)] == [5, 8, 3]  # the alias kept 8

    endless = GOOD.replace("model:\n", "model: &m\n").replace("  - ReLU\n", "  - *m\n")
    with pytest.raises(ConfigError, match="alias refers to a value that contains it") as e:
        load_config(write(tmp_path / "loop.yaml", endless))
    assert "loop.yaml:3: model[1]" in str(e.value)  # where the anchor &m is

    levels = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]" for p, n in zip("abcde", "bcdef")]  # 10^6 values
    with pytest.raises(ConfigError, match="more than 100,000 values through YAML aliases"):
        parse_yaml("\n".join(levels) + "\n", "bomb.yaml")

    with pytest.raises(ConfigError, match="a key must be a name, got a list") as e:
        parse_yaml("model:\n  - {type: Linear, [1, 2]: 3}\n", "k.yaml")
    assert "k.yaml:2" in str(e.value)
    with pytest.raises(ConfigError, match="expected a mapping for merging, but found scalar") as e:
        parse_yaml("model:\n  - {<<: [1, 2], type: Linear}\n", "m.yaml")
    assert "not allowed" not in str(e.value)


def test_integers_given_as_floats_are_recorded_as_the_integers_used():
    # `--set train.batch_size=1e3` trains with 1000; config.yaml said 1000.0
    cfg = load_config("configs/spiral.yaml", ["train.batch_size=1e3", "seed=7.0", "train.validation_split=0.5"])
    assert cfg.train.batch_size == 1000 and cfg.seed == 7
    assert type(cfg.raw["train"]["batch_size"]) is int and type(cfg.raw["seed"]) is int
    assert cfg.raw["train"]["validation_split"] == 0.5  # floats stay floats


def test_integers_given_as_floats_inside_components_are_recorded_as_the_integers_used():
    cfg = load_config("configs/spiral.yaml", ["model[0].units=1e2", "model[2].units=3.0",
                                              "train.schedule={type: step, step_size: 1e1, gamma: 0.5}"])
    assert cfg.model[0]["units"] == 100 and type(cfg.model[0]["units"]) is int
    assert type(cfg.raw["model"][2]["units"]) is int
    assert cfg.raw["train"]["schedule"] == {"type": "step", "step_size": 10, "gamma": 0.5}
    assert type(cfg.raw["train"]["schedule"]["step_size"]) is int


def test_numbers_follow_yaml_1_2_with_python_digit_separators():
    from dlrun.config.source import parse_yaml

    values = parse_yaml("a: 0o17\nb: 0x1F\nc: 60_000\nd: 010\ne: 1e-3\nf: 0b101\n", "n.yaml")[0]
    assert values == {"a": 15, "b": 31, "c": 60000, "d": "010", "e": 0.001, "f": 5}


def test_an_integer_too_long_to_convert_is_an_error_at_its_line_not_an_internal_error(cli, tmp_path):
    # Python refuses int() of over 4300 digits: it was "internal error: ValueError", exit 1
    huge = "9" * 5000
    with pytest.raises(ConfigError, match="an integer of 5000 digits is larger than any setting can take") as e:
        load_config(write(tmp_path / "h.yaml", f"model:\n  - {{type: Linear, units: {huge}}}\n"))
    assert "h.yaml:2" in str(e.value)
    r = cli("train", "configs/spiral.yaml", "--set", f"optimizer.learning_rate={huge}", "--runs-dir", tmp_path)
    assert r.code == 2 and "an integer of 5000 digits" in r.err and huge not in r.err, r.err[:300]
    assert "Traceback" not in r.err and not list(tmp_path.glob("spiral-*"))


def test_a_yaml_tag_in_a_set_value_is_refused_not_taken_as_a_string(tmp_path):
    with pytest.raises(ConfigError, match="could not determine a constructor for the tag"):
        load_config("configs/spiral.yaml", ["seed=!!python/object/apply:os.system [ls]"])


def test_a_null_model_is_one_error_not_two(tmp_path):
    with pytest.raises(ConfigError) as e:  # a single error is raised as itself (ConfigErrors: several)
        load_config(write(tmp_path / "m.yaml", "data: spiral\nmodel:\nloss: MSE\noptimizer: SGD\n"))
    assert str(e.value) == f"{tmp_path / 'm.yaml'}:2: model: expected a value (list of layers), got null"


@pytest.mark.parametrize("overrides, where, message", [
    (["model[2].units=2"], "spiral.yaml:12: model[2]: spiral: sample ", "label 2 is out of range"),
    (["loss=BinaryCrossEntropy"], "--set loss=BinaryCrossEntropy: loss: ", "takes labels 0 and 1"),
    (["loss=MSE"], "--set loss=MSE: loss: ", "the loss MSE compares each sample's 3 model outputs"),
])
def test_labels_the_model_or_loss_cannot_take_are_placed_at_what_to_change(tmp_path, overrides, where, message):
    # they named the data only ("spiral: sample 201: ..."), no file:line and no config key
    from dlrun.runs.assembly import assemble

    with pytest.raises(DlrunError) as e:
        assemble(load_config("configs/spiral.yaml", overrides))
    assert where in str(e.value) and message in str(e.value), str(e.value)


def test_a_negative_set_index_is_explained():
    with pytest.raises(ConfigError, match=r"'model\[-1\].units': a negative index does not count from the end here"):
        load_config("configs/spiral.yaml", ["model[-1].units=3"])


@pytest.mark.parametrize("value, shown", [("[16]", "got a list [16]"), ("yes", "got true"), ("", "got null"),
                                          ("{a: 1}", "got a mapping {a: 1}"), ("[false, null]", "got a list [false, null]")])
def test_a_wrong_value_is_shown_as_a_config_writes_it(value, shown):
    # "got list", "got True", "got None": the type or Python's spelling, not the value
    with pytest.raises(ConfigError) as e:
        load_config("configs/spiral.yaml", [f"model[0].units={value}"])
    assert str(e.value).endswith(f"model[0].units: expected a positive integer, {shown}"), str(e.value)


def test_a_command_line_value_that_is_not_yaml_says_why_and_where():
    from dlrun.config.source import parse_value

    with pytest.raises(ConfigError, match=r"cannot parse '\{type: spiral' as YAML: expected ',' or '\}', but got "
                                          r"'<stream end>' at column 14"):
        parse_value("{type: spiral", "--data")
