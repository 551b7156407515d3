"""`dlrun schema`: the JSON Schema generated from the registries' typed options accepts every
shipped config and every resolved config, and rejects the error corpus's type, name and option
errors; the errors a schema cannot express are listed, each with its reason."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from conftest import ROOT, run_cli
from dlrun import registry
from dlrun.config import load_config
from dlrun.config.resolved import resolved
from dlrun.config.schema import NOT_IN_SCHEMA, json_schema
from dlrun.config.source import parse_yaml
from dlrun.registry.plugins import load_plugins

CORPUS = ROOT / "tests" / "corpus" / "configs"
PLUGINS = [ROOT / "examples" / "my_layer.py", ROOT / "examples" / "bilinear.py",
           ROOT / "tests" / "corpus" / "plugins" / "ranged.py"]
SHIPPED = sorted([*(ROOT / "configs").glob("*.yaml"), *(ROOT / "examples").glob("*.yaml")])

# corpus configs the schema rejects: names, types, ranges, choices, options, required keys
REJECTED = ["bad_device", "bad_dtype", "bad_seed", "data_legacy_standardize", "data_name_key", "empty", "k_above_one", "k_zero", "layer_as_key",
            "layer_no_type", "missing_option", "model_empty", "model_not_list", "name_escapes", "negative_lr",
            "not_mapping", "plugin_float64_forward", "plugin_short_backward", "plugin_unknown_name", "rate_one",
            "several_errors", "split_one", "train_not_mapping", "type_epochs", "type_shuffle", "type_units",
            "unknown_data", "unknown_initializer", "unknown_layer", "unknown_loss", "unknown_optimizer",
            "unknown_option", "unknown_top_key", "zero_units"]
# corpus configs that are errors a schema cannot express (the reason: a key of NOT_IN_SCHEMA)
NOT_EXPRESSIBLE = {
    "nan_lr": "finite numbers",
    **dict.fromkeys(["control_char", "custom_tag", "duplicate_key", "nested_3000", "not_utf8", "python_tag",
                     "yaml_syntax", "yaml_tab"], "YAML itself"),
    **dict.fromkeys(["data_archive_named", "data_complex", "data_empty_csv", "data_float32_overflow",
                     "data_garbage_npz", "data_header_only_csv", "data_inf_csv", "data_label_fraction_csv",
                     "data_label_huge", "data_label_negative_csv", "data_label_range_csv", "data_missing_csv",
                     "data_missing_key_npz", "data_nan_csv", "data_non_numeric_csv", "data_one_column",
                     "data_pickled_npy", "data_ragged_csv", "data_regression_nan_target", "data_split_empty",
                     "data_missing_cell_csv", "data_semicolon_csv", "data_target_typo", "data_text_in_numeric",
                     "data_unseen_label_validation"], "data"),
    **dict.fromkeys(["mse_width", "shape_linear_images", "shape_softmax_rank"], "shapes"),
    "plugin_missing": "plugins",
}
VALID = ["valid", "tabular_valid"]


@pytest.fixture(scope="module")
def validator():
    load_plugins(PLUGINS)
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _raw(path: Path):
    return parse_yaml(path.read_text(), str(path))[0]


def test_every_corpus_config_is_classified():
    """A new corpus config must say whether the schema rejects it, or which check it needs."""
    names = {p.stem for p in CORPUS.glob("*.yaml")}
    classified = set(REJECTED) | set(NOT_EXPRESSIBLE) | set(VALID)
    assert names == classified, f"unclassified: {sorted(names - classified)}; gone: {sorted(classified - names)}"
    assert set(NOT_EXPRESSIBLE.values()) <= set(NOT_IN_SCHEMA)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_is_valid(validator, path):
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(_raw(path))]
    assert not errors


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_resolved_config_is_valid(validator, path):
    """The schema's types and defaults agree with dlrun's: every default written out passes."""
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(resolved(load_config(path)))]
    assert not errors


@pytest.mark.parametrize("name", REJECTED)
def test_corpus_type_name_and_option_errors_are_rejected(validator, name):
    assert not validator.is_valid(_raw(CORPUS / f"{name}.yaml"))


@pytest.mark.parametrize("name", sorted(n for n, why in NOT_EXPRESSIBLE.items() if why != "YAML itself"))
def test_what_a_schema_cannot_express_passes_it_and_dlrun_check_refuses(validator, name):
    """The schema is no substitute for `dlrun check`: these pass it and dlrun refuses them."""
    assert validator.is_valid(_raw(CORPUS / f"{name}.yaml"))
    assert run_cli("check", CORPUS / f"{name}.yaml").code == 2


@pytest.mark.parametrize("name", VALID)
def test_the_valid_corpus_configs_pass(validator, name):
    assert validator.is_valid(_raw(CORPUS / f"{name}.yaml"))


def test_every_component_and_option_is_in_the_schema(validator):
    defs = validator.schema["$defs"]
    for kind, reg in registry.REGISTRIES.items():
        for name in reg.names():
            props = defs[f"{kind}.{name}"]["properties"]
            for o in reg.options(name):
                assert o.name in props, f"{kind} {name}.{o.name}"
                if not o.required and isinstance(o.default, (int, float, str, bool)):
                    assert props[o.name]["default"] == o.default
                if o.doc:
                    assert props[o.name]["description"] == o.doc
            assert defs[f"{kind}.{name}"]["required"] == [o.name for o in reg.options(name) if o.required]


def test_the_schema_checks_values_as_dlrun_does(validator):
    base = _raw(CORPUS / "valid.yaml")

    def ok(**changes):
        return validator.is_valid({**base, **changes})

    assert ok(optimizer={"type": "SGD", "learning_rate": 1})  # an integer where a number is expected
    assert ok(train={"epochs": 1000.0})  # a whole number where an integer is expected
    assert not ok(train={"epochs": 0}) and not ok(train={"epochs": True})
    assert not ok(train={"early_stopping": {"patience": 3, "mode": "best"}})
    assert ok(train={"early_stopping": {"patience": 3}, "metrics": ["f1", {"type": "top_k_accuracy", "k": 2, "name": "top2"}]})
    assert not ok(train={"metrics": [{"type": "top_k_accuracy", "k": 0}]})
    assert ok(train={"schedule": {"type": "warmup", "then": {"type": "cosine"}}})
    assert not ok(train={"schedule": {"type": "warmup", "then": {"type": "cosin"}}})
    assert ok(model=[{"type": "Conv2D", "filters": 4, "kernel_size": [3, 3], "padding": "same"}, "Flatten"])
    assert not ok(model=[{"type": "Conv2D", "filters": 4, "kernel_size": [3, 3, 3]}])
    assert not ok(model=[{"type": "Linear", "units": 2, "trainable": "no"}])
    assert ok(model=[{"type": "Linear", "units": 2, "trainable": False, "weight_regularizer": {"type": "L1", "strength": 0.1}}])
    assert not ok(model=["Linear"])  # its units are required: the name alone is not enough
    assert ok(data={"type": "spiral", "preprocess": {"numeric": "standardize"}})
    assert not ok(data={"type": "spiral", "preprocess": {"numeric": "zscore"}})


def test_dlrun_schema_names_plugins_only_when_given(tmp_path):
    r = run_cli("schema")
    assert r.code == 0, r.err
    plain = json.loads(r.out)
    assert "layers.MyMarginFC" not in plain["$defs"] and "layers.Linear" in plain["$defs"]
    out = tmp_path / "dlrun.schema.json"
    r = run_cli("schema", "--plugin", ROOT / "examples" / "my_layer.py", "--output", out)
    assert r.code == 0, r.err
    schema = json.loads(out.read_text())
    assert "MyMarginFC" in schema["$defs"]["layers.MyMarginFC"]["properties"]["type"]["const"]
    assert "my_layer.py" in schema["$defs"]["layers.MyMarginFC"]["description"]
    # the written schema validates the example that needs the plugin
    assert jsonschema.Draft202012Validator(schema).is_valid(_raw(ROOT / "examples" / "my_layer.yaml"))
    assert not jsonschema.Draft202012Validator(plain).is_valid(_raw(ROOT / "examples" / "my_layer.yaml"))


def test_dlrun_schema_output_that_cannot_be_written_is_one_line(tmp_path):
    r = run_cli("schema", "--output", tmp_path / "missing" / "s.json")
    assert r.code == 2 and r.err.count("\n") == 1 and "missing" in r.err
    assert not (tmp_path / "missing").exists()


def test_docs_describe_the_editor_set_up():
    text = (ROOT / "docs" / "config.md").read_text()
    assert "# yaml-language-server: $schema=" in text and "yaml.schemas" in text and "dlrun schema" in text
    for reason in NOT_IN_SCHEMA:
        assert reason in text, reason
