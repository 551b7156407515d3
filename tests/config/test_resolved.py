"""The resolved config (`dlrun config`, config.resolved.yaml): every default written out, accepted
by `dlrun train`, and training exactly as the config it came from."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, spiral_config, train
from conftest import ROOT, run_cli, write
from dlrun import registry
from dlrun.config import config_from_dict, load_config
from dlrun.config.resolved import component, resolved
from dlrun.config.settings import TOP_LEVEL, EarlyStoppingSettings, TrainSettings
from dlrun.config.source import parse_yaml
from dlrun.data.preprocess import Settings as Preprocess
from dlrun.registry.plugins import load_plugins
from dlrun.runs import checkpoint

SHIPPED = sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")])


def _load(path: Path):
    if path.parent.name == "examples":
        load_plugins([ROOT / "examples" / "my_layer.py"])
    return load_config(path)


def _layers(entries, path="model"):
    """(path, layer entry) of every layer of a resolved model list, inside blocks too."""
    for i, e in enumerate(entries):
        if e.get("type") == "Residual":
            yield from _layers(e["body"], f"{path}[{i}].body")
            if e["projection"] is not None:
                yield from _layers(e["projection"] if isinstance(e["projection"], list) else [e["projection"]],
                                   f"{path}[{i}].projection")
        elif e.get("type") == "Parallel":
            for m, branch in enumerate(e["branches"]):
                yield from _layers(branch, f"{path}[{i}].branches[{m}]")
        elif "shares" not in e:
            yield f"{path}[{i}]", e


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_config_resolves_to_every_default_and_back(path):
    config = _load(path)
    full = resolved(config)
    assert list(full) == list(TOP_LEVEL)
    train = full["train"]
    assert list(train) == [f for f in TrainSettings.__dataclass_fields__]
    if train["early_stopping"] is not None:
        assert list(train["early_stopping"]) == list(EarlyStoppingSettings.__dataclass_fields__)
    for i, layer in _layers(full["model"]):  # every option of every layer, nested initializers too
        options = [o.name for o in registry.layers.options(layer["type"])]
        node = [k for k in ("name", "inputs") if k in layer]  # a graph node's, as given
        assert list(layer) == ["type", *options, "trainable", *node], i
        for name in options:
            if name.endswith("initializer"):
                init = layer[name]
                assert list(init) == ["type", *(o.name for o in registry.initializers.options(init["type"]))]
    for kind, reg in (("data", registry.data), ("loss", registry.losses), ("optimizer", registry.optimizers)):
        assert list(full[kind])[:len(reg.options(full[kind]["type"])) + 1] == \
            ["type", *(o.name for o in reg.options(full[kind]["type"]))], kind
    given = config.raw["data"]
    if isinstance(given, dict) and "preprocess" in given:  # with its defaults; absent stays absent (no preprocessing)
        assert list(full["data"]["preprocess"]) == list(Preprocess.__dataclass_fields__)
    else:
        assert "preprocess" not in full["data"]
    # dlrun train accepts it, and resolving it again changes nothing
    again = config_from_dict(full, origin="resolved")
    assert resolved(again) == full


@pytest.mark.parametrize("kind", sorted(registry.REGISTRIES))
def test_every_component_that_needs_no_option_resolves_to_a_spec_its_registry_accepts(kind):
    reg = registry.REGISTRIES[kind]
    names = [n for n in reg.names() if not any(o.required for o in reg.options(n))]
    assert names
    for name in names:
        spec = component(reg, name)
        assert spec["type"] == name and set(spec) >= {o.name for o in reg.options(name)}
        options = {k: v for k, v in spec.items() if k not in reg.entry_keys}
        reg.check(options, kind)  # every default is a value the option accepts


def test_dlrun_config_prints_the_resolved_config_with_set_items_applied(tmp_path):
    r = run_cli("config", ROOT / "configs" / "spiral.yaml", "--set", "train.epochs=3", "--set", "model[0].units=8")
    assert r.code == 0, r.err
    printed, _ = parse_yaml(r.out)
    assert printed["train"]["epochs"] == 3 and printed["model"][0]["units"] == 8
    assert printed["model"][0]["use_bias"] is True and printed["optimizer"]["nesterov"] is False
    assert printed["train"]["schedule_interval"] == "epoch" and printed["name"] == "spiral"
    unseeded = write(tmp_path / "unseeded.yaml", "\n".join(
        line for line in (ROOT / "configs" / "spiral.yaml").read_text().splitlines() if not line.startswith("seed:")))
    printed, _ = parse_yaml(run_cli("config", unseeded).out)
    assert printed["seed"] is None  # drawn when a run starts


def test_dlrun_config_reports_a_bad_set_item_in_one_line():
    r = run_cli("config", ROOT / "configs" / "spiral.yaml", "--set", "train.epoch=3")
    assert r.code == 2 and "did you mean epochs?" in r.err and "Traceback" not in r.err
    assert r.out == ""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moons_dropout", "iris"])
def test_the_resolved_config_trains_exactly_as_the_config(tmp_path, name):
    """moons_dropout (dropout, AdamW, warm-up then cosine, clipping, early stopping) and iris
    (preprocessing) for a few epochs, then the run's config.resolved.yaml, and `dlrun config`'s
    output: same metrics, same weights."""
    source = ROOT / "configs" / f"{name}.yaml"
    first = train(source, tmp_path / "a", "--set", "train.epochs=6")
    kept = first / "config.resolved.yaml"
    printed = write(tmp_path / "printed.yaml", run_cli("config", source, "--set", "train.epochs=6").out)
    assert parse_yaml(kept.read_text())[0] == parse_yaml(printed.read_text())[0]  # (the config's seed is 0)
    # config.yaml stays what the user wrote (and --set), with the seed
    written, given = parse_yaml((first / "config.yaml").read_text())[0], parse_yaml(source.read_text())[0]
    assert written == {**given, "plugins": [], "train": {**given["train"], "epochs": 6}}
    for again in (train(kept, tmp_path / "b"), train(printed, tmp_path / "c")):
        assert metrics_rows(again) == metrics_rows(first)
        a = checkpoint.read(first / "checkpoints" / "last.npz").model
        b = checkpoint.read(again / "checkpoints" / "last.npz").model
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert (again / "config.resolved.yaml").read_text() == kept.read_text()


def test_a_run_without_a_seed_records_the_drawn_seed_in_both_config_files(tmp_path):
    cfg = spiral_config(tmp_path, epochs=1)
    write(cfg, "\n".join(line for line in cfg.read_text().splitlines() if not line.startswith("seed:")) + "\n")
    run_dir = train(cfg, tmp_path / "runs")
    written = parse_yaml((run_dir / "config.yaml").read_text())[0]
    full = parse_yaml((run_dir / "config.resolved.yaml").read_text())[0]
    assert isinstance(written["seed"], int) and full["seed"] == written["seed"]


def test_a_resumed_run_keeps_its_name_in_the_resolved_config(tmp_path):
    cfg = spiral_config(tmp_path, name="curve", epochs=2)
    write(cfg, cfg.read_text().replace("name: curve\n", ""))  # named after its file
    run_dir = train(cfg, tmp_path / "runs")
    before = (run_dir / "config.resolved.yaml").read_text()
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=3")
    assert r.code == 0, r.err
    after = parse_yaml((run_dir / "config.resolved.yaml").read_text())[0]
    assert after["name"] == "curve" and after["train"]["epochs"] == 3
    assert {**parse_yaml(before)[0], "train": {**parse_yaml(before)[0]["train"], "epochs": 3}} == after
    assert "name" not in parse_yaml((run_dir / "config.yaml").read_text())[0]
