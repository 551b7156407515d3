"""The error corpus: broken configs, data files, command lines and checkpoints.

Each case runs the real CLI and asserts the exit code, that stderr names the problem (file:line,
key path or file and row) and that no traceback is printed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, run_cli, write

C = "tests/corpus/configs"
D = "tests/corpus/data"

# (case, argv, exit code, fragments that must all appear in stderr)
CASES = [
    # -- config files -----------------------------------------------------------------------
    ("yaml_syntax", ["check", f"{C}/yaml_syntax.yaml"], 2, ["yaml_syntax.yaml:3", "YAML syntax error"]),
    ("yaml_tab", ["check", f"{C}/yaml_tab.yaml"], 2, ["yaml_tab.yaml:3", "'\\t'"]),
    ("python_tag", ["check", f"{C}/python_tag.yaml"], 2, ["python_tag.yaml:1", "python/object/apply:os.system", "not allowed"]),
    ("custom_tag", ["check", f"{C}/custom_tag.yaml"], 2, ["custom_tag.yaml:6", "'!include' is not allowed"]),
    ("duplicate_key", ["check", f"{C}/duplicate_key.yaml"], 2, ["duplicate_key.yaml:9", "duplicate key 'loss'"]),
    ("not_mapping", ["check", f"{C}/not_mapping.yaml"], 2, ["not_mapping.yaml:1", "expected a mapping"]),
    ("empty", ["check", f"{C}/empty.yaml"], 2, ["missing required key 'data'", "missing required key 'optimizer'"]),
    ("unknown_top_key", ["check", f"{C}/unknown_top_key.yaml"], 2, ["unknown_top_key.yaml:7: optimiser", "did you mean optimizer?"]),
    ("unknown_layer", ["check", f"{C}/unknown_layer.yaml"], 2, ["unknown_layer.yaml:4: model[1]", "'Relu'", "did you mean ReLU?"]),
    ("unknown_option", ["check", f"{C}/unknown_option.yaml"], 2, ["unknown_option.yaml:3: model[0].unit:", "did you mean units?"]),
    ("missing_option", ["check", f"{C}/missing_option.yaml"], 2, ["missing_option.yaml:3: model[0]", "needs option 'units'"]),
    ("unknown_loss", ["check", f"{C}/unknown_loss.yaml"], 2, ["unknown_loss.yaml:6: loss", "SoftmaxCrossEntropy?"]),
    ("unknown_optimizer", ["check", f"{C}/unknown_optimizer.yaml"], 2, ["unknown_optimizer.yaml:7: optimizer", "did you mean SGD?"]),
    ("unknown_initializer", ["check", f"{C}/unknown_initializer.yaml"], 2, ["unknown_initializer.yaml:3: model[0].weight_initializer", "he_normal"]),
    ("unknown_data", ["check", f"{C}/unknown_data.yaml"], 2, ["unknown_data.yaml:1: data.type", "did you mean spiral?"]),
    ("type_units", ["check", f"{C}/type_units.yaml"], 2, ["type_units.yaml:3: model[0].units", "expected a positive integer, got 'ten'"]),
    ("type_epochs", ["check", f"{C}/type_epochs.yaml"], 2, ["type_epochs.yaml:9: train.epochs", "got 2.5"]),
    ("type_shuffle", ["check", f"{C}/type_shuffle.yaml"], 2, ["type_shuffle.yaml:9: train.shuffle", "expected true or false, got 3"]),
    ("negative_lr", ["check", f"{C}/negative_lr.yaml"], 2, ["negative_lr.yaml:9: optimizer.learning_rate", "> 0, got -0.1"]),
    ("nan_lr", ["check", f"{C}/nan_lr.yaml"], 2, ["nan_lr.yaml:9: optimizer.learning_rate", "got nan"]),
    ("zero_units", ["check", f"{C}/zero_units.yaml"], 2, ["zero_units.yaml:3: model[0].units", "got 0"]),
    ("rate_one", ["check", f"{C}/rate_one.yaml"], 2, ["rate_one.yaml:5: model[1].rate", "< 1, got 1.0"]),
    ("k_zero", ["check", f"{C}/k_zero.yaml"], 2, ["k_zero.yaml:5: model[1].k", "> 0 and <= 1, got 0"]),
    ("k_above_one", ["check", f"{C}/k_above_one.yaml"], 2, ["k_above_one.yaml:5: model[1].k", "got 1.5"]),
    ("split_one", ["check", f"{C}/split_one.yaml"], 2, ["split_one.yaml:9: train.validation_split", "< 1, got 1.0"]),
    ("model_not_list", ["check", f"{C}/model_not_list.yaml"], 2, ["model_not_list.yaml:2: model", "non-empty list"]),
    ("model_empty", ["check", f"{C}/model_empty.yaml"], 2, ["model_empty.yaml:2: model", "got []"]),
    ("layer_no_type", ["check", f"{C}/layer_no_type.yaml"], 2, ["layer_no_type.yaml:3: model[0]", "'type' key"]),
    ("layer_as_key", ["check", f"{C}/layer_as_key.yaml"], 2, ["layer_as_key.yaml:3: model[0]", "write it as {type: Linear, units: 4}",
                                                               "layer_as_key.yaml:4: model[1]", "write it as ReLU"]),
    ("name_escapes", ["check", f"{C}/name_escapes.yaml"], 2, ["name_escapes.yaml:1: name", "without path separators", "'../outside'"]),
    ("mse_width", ["check", f"{C}/mse_width.yaml"], 2, ["the loss MSE compares each sample's 3 model outputs with its 1 target",
                                                        "units: 1", "SoftmaxCrossEntropy"]),
    ("data_name_key", ["check", f"{C}/data_name_key.yaml"], 2, ["data_name_key.yaml:1: data", "with 'type', not 'name'"]),
    ("shape_linear_images", ["check", f"{C}/shape_linear_images.yaml"], 2, ["shape_linear_images.yaml:3: model[0]", "(1, 8, 8)", "Flatten"]),
    ("shape_softmax_rank", ["check", f"{C}/shape_softmax_rank.yaml"], 2, ["shape_softmax_rank.yaml:4: model[1]", "Linear expects"]),
    ("bad_device", ["check", f"{C}/bad_device.yaml"], 2, ["bad_device.yaml:1: device", "got 'tpu'"]),
    ("bad_dtype", ["check", f"{C}/bad_dtype.yaml"], 2, ["bad_dtype.yaml:1: dtype", "got 'float16'"]),
    ("bad_seed", ["check", f"{C}/bad_seed.yaml"], 2, ["bad_seed.yaml:1: seed", "expected an integer"]),
    ("plugin_missing", ["check", f"{C}/plugin_missing.yaml"], 2, ["plugin_missing.yaml:1: plugins", "nothere.py"]),
    ("plugin_unknown_name", ["check", f"{C}/plugin_unknown_name.yaml"], 2, ["plugin_unknown_name.yaml:5: model[1]", "did you mean Ranged?"]),
    ("train_not_mapping", ["check", f"{C}/train_not_mapping.yaml"], 2, ["train_not_mapping.yaml:8: train", "got 5"]),
    # -- data files -------------------------------------------------------------------------
    ("data_missing", ["check", f"{C}/data_missing_csv.yaml"], 2, ["data_missing_csv.yaml:1: data", "not found", "missing.csv"]),
    ("data_non_numeric", ["check", f"{C}/data_non_numeric_csv.yaml"], 2, [f"{D}/non_numeric.csv:4", "column 2", "'abc'"]),
    ("data_ragged", ["check", f"{C}/data_ragged_csv.yaml"], 2, [f"{D}/ragged.csv:3", "expected 3 columns", "got 2"]),
    ("data_nan", ["check", f"{C}/data_nan_csv.yaml"], 2, [f"{D}/nan.csv:3", "NaN"]),
    ("data_inf", ["check", f"{C}/data_inf_csv.yaml"], 2, [f"{D}/inf.csv:2", "inf"]),
    ("data_label_fraction", ["check", f"{C}/data_label_fraction_csv.yaml"], 2, [f"{D}/label_fraction.csv:3", "integers", "1.5"]),
    ("data_label_negative", ["check", f"{C}/data_label_negative_csv.yaml"], 2, [f"{D}/label_negative.csv:2", "got -1"]),
    ("data_label_range", ["check", f"{C}/data_label_range_csv.yaml"], 2, [f"{D}/label_range.csv:3", "label 5 is out of range", "outputs 2"]),
    ("data_header_only", ["check", f"{C}/data_header_only_csv.yaml"], 2, [f"{D}/header_only.csv", "no data rows"]),
    ("data_empty", ["check", f"{C}/data_empty_csv.yaml"], 2, [f"{D}/empty.csv", "no rows"]),
    ("data_garbage_npz", ["check", f"{C}/data_garbage_npz.yaml"], 2, [f"{D}/garbage.npz", "not a zip"]),
    ("data_missing_key", ["check", f"{C}/data_missing_key_npz.yaml"], 2, [f"{D}/missing_key.npz", "no array 'x'", "features, y"]),
    ("data_pickled", ["check", f"{C}/data_pickled_npy.yaml"], 2, [f"{D}/pickled.npy", "pickled"]),
    ("data_split_empty", ["check", f"{C}/data_split_empty.yaml"], 2, ["data_split_empty.yaml:6: train.validation_split", "no validation data"]),
    ("data_regression_nan", ["check", f"{C}/data_regression_nan_target.yaml"], 2, [f"{D}/nan.csv:3", "finite"]),
    ("data_label_huge", ["check", f"{C}/data_label_huge.yaml"], 2, [f"{D}/label_huge.csv:3", "integers from 0 to 2147483647", "1e+30"]),
    ("data_float32_overflow", ["check", f"{C}/data_float32_overflow.yaml"], 2, [f"{D}/float32_overflow.csv:2", "1e+39", "range of float32", "dtype: float64"]),
    ("data_archive_named_npy", ["check", f"{C}/data_archive_named.yaml"], 2, [f"{D}/archive_named.npy", "holds an .npz archive"]),
    ("data_complex", ["check", f"{C}/data_complex.yaml"], 2, [f"{D}/complex.npy", "complex numbers"]),
    ("monitor_without_validation", ["check", f"{C}/valid.yaml", "--set", "train.monitor=val_loss"], 2,
     ["--set train.monitor=val_loss: train.monitor", "needs validation data"]),
    ("data_label_column", ["check", f"{C}/data_one_column.yaml"], 2, [f"{D}/one_row.csv", "label_column 5"]),
    ("data_semicolon", ["check", f"{C}/data_semicolon_csv.yaml"], 2, [f"{D}/semicolon.csv:2", "got 1", "set data.delimiter: ';'"]),
    ("data_target_typo", ["check", f"{C}/data_target_typo.yaml"], 2, [f"{D}/tabular.csv:1", "data.target: no column 'lable'", "did you mean label?"]),
    ("data_text_in_numeric_column", ["check", f"{C}/data_text_in_numeric.yaml"], 2,
     [f"{D}/tabular.csv:2", "column 2: expected a number, got 'red'", "column 'colour'", "data.categorical"]),
    ("data_missing_cell", ["check", f"{C}/data_missing_cell_csv.yaml"], 2, [f"{D}/missing_cell.csv:3", "column 'b'", "missing value", "missing: mean"]),
    ("data_unseen_label_in_validation", ["check", f"{C}/data_unseen_label_validation.yaml"], 2,
     [f"{D}/tabular_unseen_label.csv:3", "column 'label'", "label 'huge' was not seen in training", "big, small"]),
    ("data_legacy_standardize", ["check", f"{C}/data_legacy_standardize.yaml"], 2,
     ["data_legacy_standardize.yaml:1: data.standardize", "preprocess: {numeric: standardize}"]),
    ("data_preprocess_typo", ["check", f"{C}/tabular_valid.yaml", "--set", "data.preprocess.numeric=zscore"], 2,
     ["data.preprocess.numeric", "'zscore'", "standardize"]),
    # -- command lines ----------------------------------------------------------------------
    ("set_no_equals", ["check", f"{C}/valid.yaml", "--set", "train.epochs"], 2, ["--set", "expected KEY=VALUE"]),
    ("set_unknown_key", ["check", f"{C}/valid.yaml", "--set", "trian.epochs=3"], 2, ["--set trian.epochs=3: trian", "did you mean train?"]),
    ("set_index_range", ["check", f"{C}/valid.yaml", "--set", "model[9].units=3"], 2, ["--set model[9].units=3: model[9]", "out of range"]),
    ("set_bad_value", ["check", f"{C}/valid.yaml", "--set", "model[0].units=-3"], 2, ["--set model[0].units=-3: model[0].units", "got -3"]),
    ("set_abbrev", ["check", f"{C}/valid.yaml", "--set", "optimizer.lr=0.5"], 2, ["optimizer.lr", "did you mean learning_rate?"]),
    ("set_python_tag", ["check", f"{C}/valid.yaml", "--set", "train.epochs=!!python/object/apply:os.getcwd []"], 2, ["train.epochs", "could not determine a constructor for the tag"]),
    ("set_and_file_together", ["check", f"{C}/zero_units.yaml", "--set", "train.epochs=0"], 2, ["zero_units.yaml:3: model[0].units", "--set train.epochs=0: train.epochs"]),
    ("set_negative_seed", ["check", f"{C}/valid.yaml", "--set", "seed=-1"], 2, ["--set seed=-1: seed", ">= 0, got -1"]),
    ("set_data_null", ["check", f"{C}/valid.yaml", "--set", "data=null"], 2, ["--set data=null: data", "got null"]),
    ("set_octal_typo", ["check", f"{C}/valid.yaml", "--set", "model[0].units=010"], 2, ["model[0].units", "got '010'"]),
    ("set_base60_typo", ["check", f"{C}/valid.yaml", "--set", "seed=1:00"], 2, ["--set seed=1:00: seed", "got '1:00'"]),
    ("set_duplicate_key", ["check", f"{C}/valid.yaml", "--set", "optimizer={type: SGD, type: Adam}"], 2,
     ["optimizer: duplicate key 'type' in the value"]),
    ("set_unparseable", ["check", f"{C}/valid.yaml", "--set", "optimizer={type: SGD, learning_rate: [0.1"], 2,
     ["optimizer: cannot parse the value", "as YAML"]),
    ("set_bad_path", ["check", f"{C}/valid.yaml", "--set", "train..epochs=3"], 2, ["expected a key path", "'train..epochs'"]),
    ("set_index_into_mapping", ["check", f"{C}/valid.yaml", "--set", "model[0][1]=3"], 2, ["model[0][1]", "no such list"]),
    ("set_generator_seed", ["check", f"{C}/valid.yaml", "--set", "data.seed=-3"], 2, ["--set data.seed=-3: data.seed", "got -3"]),
    ("set_train_list", ["check", f"{C}/valid.yaml", "--set", "train=[]"], 2, ["--set train=[]: train", "expected a mapping", "got []"]),
    ("embedding_float_features", ["check", f"{C}/valid.yaml", "--set", "model[0]={type: Embedding, input_dim: 10, output_dim: 4}",
                                  "--set", "model[1]=Flatten"], 2, ["model[0] Embedding takes integer indices, got 0."]),
    ("config_not_found", ["check", "nothere.yaml"], 2, ["config file not found: nothere.yaml"]),
    ("unknown_command", ["trian", f"{C}/valid.yaml"], 2, ["No such command 'trian'"]),
    ("device_flag", ["check", f"{C}/valid.yaml", "--device", "tpu"], 2, ["--device: device", "got 'tpu'"]),
    ("show_unknown", ["show", "Relu"], 2, ["did you mean ReLU?"]),
    ("list_unknown_kind", ["list", "layer"], 2, ["unknown kind 'layer'", "did you mean layers?"]),
    ("plugin_flag_missing", ["check", f"{C}/valid.yaml", "--plugin", "nothere.py"], 2, ["plugin file not found: nothere.py"]),
    ("runs_dir_is_file", ["train", f"{C}/valid.yaml", "--runs-dir", f"{D}/good.csv/runs"], 2, ["cannot create the runs directory", "good.csv", "a file is in the way"]),
    # paths and names longer than a file name may be (255 bytes): they were internal errors or exit 1
    ("config_path_too_long", ["check", f"{C}/{'a' * 300}.yaml"], 2, ["(326 characters): File name too long"]),
    ("runs_dir_too_long", ["train", f"{C}/valid.yaml", "--runs-dir", f"{D}/{'r' * 300}"], 2, ["cannot create the runs directory", "give a shorter path"]),
    ("run_name_too_long", ["check", f"{C}/valid.yaml", "--set", f"name={'n' * 300}"], 2, ["name: expected a run name of at most 200 bytes", "(300 characters)"]),
    ("initializer_overflows", ["check", f"{C}/valid.yaml", "--set", "model[0].weight_initializer={type: constant, value: 1e300}"], 2, ["model[0]", "not finite in float32"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,argv,code,fragments", CASES, ids=[c[0] for c in CASES])
def test_corpus_case(case, argv, code, fragments):
    r = run_cli(*argv)
    assert r.code == code, (r.code, r.err)
    for f in fragments:
        assert f in r.err, f"{f!r} not in stderr:\n{r.err}"
    assert "Traceback" not in r.err + r.out


# raw inputs a tabular model refuses at predict and evaluate time: (case, command, input, fragments)
TABULAR_INPUTS = [
    ("unseen_category", "predict", "tabular_unseen_category.csv", ["tabular_unseen_category.csv:3", "column 'colour'",
                                                                   "category 'purple' was not seen in training"]),
    ("missing_column", "predict", "tabular_missing_column.csv", ["tabular_missing_column.csv:1", "no column 'colour'",
                                                                 "size, colour, weight"]),
    ("wrong_type", "predict", "tabular_wrong_type.csv", ["tabular_wrong_type.csv:3", "column 3", "got 'heavy'", "column 'weight'"]),
    ("unseen_label", "evaluate", "tabular_unseen_label.csv", ["tabular_unseen_label.csv:3", "column 'label'",
                                                              "label 'huge' was not seen in training"]),
    ("numbers_for_categories", "predict", "good.csv", ["good.csv:1", "header row naming the columns size, colour, weight"]),
]


@pytest.fixture(scope="module")
def tabular_run(tmp_path_factory):
    r = run_cli("train", f"{C}/tabular_valid.yaml", "--runs-dir", tmp_path_factory.mktemp("tabular"))
    assert r.code == 0, r.err
    return r.out.strip().splitlines()[-1]


@pytest.mark.parametrize("case,command,name,fragments", TABULAR_INPUTS, ids=[c[0] for c in TABULAR_INPUTS])
def test_tabular_input_case(tabular_run, case, command, name, fragments):
    flag = "--input" if command == "predict" else "--data"
    r = run_cli(command, tabular_run, flag, f"{D}/{name}")
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1, r.err
    for f in fragments:
        assert f in r.err, f"{f!r} not in stderr:\n{r.err}"
    assert "Traceback" not in r.err + r.out


def test_corpus_is_large_enough():
    assert len(CASES) + len(CHECKPOINT_CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


def test_errors_are_sorted_by_line():
    r = run_cli("check", f"{C}/several_errors.yaml")
    lines = [int(l.split("several_errors.yaml:")[1].split(":")[0]) for l in r.err.splitlines()]
    assert r.code == 2 and lines == sorted(lines) and len(lines) == 4, r.err


def test_debug_shows_traceback_as_a_global_option():
    r = run_cli("--debug", "check", f"{C}/negative_lr.yaml")
    assert r.code == 2
    assert "Traceback" in r.err and "ConfigError" in r.err
    assert "negative_lr.yaml:9: optimizer.learning_rate" in r.err


def test_valid_config_passes_check():
    r = run_cli("check", f"{C}/valid.yaml")
    assert r.code == 0, r.err
    assert "backward, one optimizer step: OK (nothing saved, nothing written)" in r.out


# -- checkpoints: made from a real run, then broken --------------------------------------------
def _good_checkpoint(tmp_path):
    r = run_cli("train", f"{C}/valid.yaml", "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    return next((tmp_path / "runs").glob("*/checkpoints/last.npz"))


def _truncate(src, dst):
    dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2])


def _flip(src, dst):
    b = bytearray(src.read_bytes())
    for i in range(len(b) // 3, len(b) // 3 + 64):
        b[i] ^= 0xFF
    dst.write_bytes(bytes(b))


def _text(src, dst):
    dst.write_text("not a checkpoint\n")


def _pickled(src, dst):
    np.savez(dst, **{"model/0.weight": np.array([{"x": 1}], dtype=object), "meta": np.frombuffer(b"{}", np.uint8)})


def _add_record(value):
    def make(src, dst):  # a good checkpoint plus a record no dlrun checkpoint has (it loaded unnoticed)
        with np.load(src) as z:
            arrays = {k: z[k] for k in z.files}
        np.savez(dst, **arrays, evil=value)
    return make


def _no_meta(src, dst):
    np.savez(dst, **{"model/0.weight": np.zeros((4, 2), np.float32)})


def _meta_list(src, dst):
    np.savez(dst, **{"meta": np.frombuffer(b"[1, 2]", np.uint8)})


def _edit_meta(**changes):
    def make(src, dst):
        with np.load(src) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(bytes(arrays["meta"]).decode())
        meta.update(changes)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(dst, **arrays)
    return make


CHECKPOINT_CASES = [
    ("ckpt_missing", None, [], 2, ["checkpoint not found"]),
    ("ckpt_truncated", _truncate, [], 2, ["corrupt or truncated"]),
    ("ckpt_flipped_bytes", _flip, [], 2, ["corrupt or truncated"]),
    ("ckpt_text", _text, [], 2, ["corrupt or truncated"]),
    ("ckpt_pickled", _pickled, [], 2, ["pickled objects; refusing"]),
    ("ckpt_pickled_extra", _add_record(np.array([{"x": 1}], dtype=object)), [], 2, ["pickled objects; refusing"]),
    ("ckpt_extra_record", _add_record(np.zeros(3)), [], 2, ["not a dlrun checkpoint: unexpected record 'evil'"]),
    ("ckpt_no_meta", _no_meta, [], 2, ["not a dlrun checkpoint"]),
    ("ckpt_meta_not_record", _meta_list, [], 2, ["record is not a JSON object"]),
    ("ckpt_meta_shape", _edit_meta(input_shape="abc"), [], 2, ["corrupt checkpoint: meta.input_shape: expected a list "
                                                             "of positive integers, got 'abc'"]),
    ("ckpt_meta_epoch", _edit_meta(epoch=-1), [], 2, ["corrupt checkpoint: meta.epoch: expected a non-negative integer"]),
    ("ckpt_other_model", "copy", ["--set", "model[0].units=5", "--set", "model[1]=Tanh"], 2,
     ["does not fit the model (4 problems)", "0.weight: shape (4, 2) in the checkpoint, (5, 2) in the model",
      "layers: the checkpoint has [Linear, ReLU, Linear], the model has [Linear, Tanh, Linear]"]),
    ("ckpt_other_features", "copy", ["--set", f"data={{type: file, path: {ROOT / D / 'four_features.csv'}}}"], 2,
     ["four_features.csv:1: each sample has 4 features, but the model in", "takes 2 features"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,make,extra,code,fragments", CHECKPOINT_CASES, ids=[c[0] for c in CHECKPOINT_CASES])
def test_checkpoint_case(tmp_path, case, make, extra, code, fragments):
    dst = tmp_path / "broken.npz"
    if make == "copy":
        dst = _good_checkpoint(tmp_path)
    elif make is not None:
        make(_good_checkpoint(tmp_path), dst)
    r = run_cli("check", f"{C}/valid.yaml", "--checkpoint", dst, *extra)
    assert r.code == code, (r.code, r.err)
    for f in fragments:
        assert f in r.err, f"{f!r} not in stderr:\n{r.err}"
    assert "Traceback" not in r.err + r.out


def test_good_checkpoint_fits(tmp_path):
    ckpt = _good_checkpoint(tmp_path)
    r = run_cli("check", f"{C}/valid.yaml", "--checkpoint", ckpt)
    assert r.code == 0, r.err
    assert "fits the model" in r.out
    r = run_cli("check", f"{C}/valid.yaml", "--checkpoint", ckpt.parent.parent)  # a run directory, as predict takes
    assert r.code == 0, r.err
    assert "checkpoints/best.npz fits the model" in r.out


def test_component_kinds_take_the_right_article(tmp_path):
    r = run_cli("check", f"{C}/valid.yaml", "--set", "optimizer=[1]")
    assert r.code == 2 and "expected an optimizer name or a mapping" in r.err, r.err


def test_files_of_the_wrong_kind_are_named_for_what_they_are(tmp_path):
    text_npy = write(tmp_path / "x.npy", "1,2,0\n3,4,1\n")
    cfg = write(tmp_path / "c.yaml", f"data: {{type: file, path: {text_npy}}}\nmodel: [{{type: Linear, units: 2}}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n")
    r = run_cli("check", cfg)
    assert r.code == 2 and "not an .npy file (no NumPy header)" in r.err and "pickled" not in r.err, r.err
    r = run_cli("evaluate", cfg)
    assert r.code == 2 and "a config file, not a checkpoint; train it first" in r.err, r.err
    r = run_cli("check", tmp_path)
    assert r.code == 2 and "(it is a folder)" in r.err, r.err
    r = run_cli("gradcheck", "Linear", "--dims", "N=100000000000", process=True)  # (a kill ends that process only)
    assert r.code == 2 and "out of memory" in r.err and "Traceback" not in r.err, r.err



def test_a_parameter_larger_than_memory_is_refused_before_the_os_kills_the_process(monkeypatch):
    # Linux grants a 15 GiB numpy array and kills the process (exit 137, no message) on first
    # touch; so add_param compares what making a parameter needs with the memory available
    import dlrun.backend.memory
    from dlrun.config import load_config
    from dlrun.errors import ShapeError
    from dlrun.runs.assembly import build_model

    monkeypatch.setattr(dlrun.backend.memory, "host_memory_available", lambda: 64 * 2**20)  # 64 MiB left
    cfg = load_config("configs/spiral.yaml", ["model[0].units=4000000"])  # 8e6 weights: 160 MB to make
    with pytest.raises(ShapeError) as e:
        build_model(cfg, (2,))
    assert e.value.exit_code == 2 and str(e.value.where).endswith("spiral.yaml:10: model[0]")
    assert e.value.message == ("Linear cannot take input of shape (2,): parameter 'weight' of shape (4000000, 2) "
                               "(8,000,000 values) while it is made needs about 152.6 MiB, more than the 64.0 MiB of "
                               "memory available")
    assert build_model(load_config("configs/spiral.yaml", ["model[0].units=400000"]), (2,))  # 15 MiB: fits


def test_a_batch_whose_outputs_cannot_fit_is_refused_with_the_batch_size_that_would(monkeypatch):
    # the same OS kill, from activations: the outputs and their gradients bound a step's peak
    import dlrun.backend.memory
    from dlrun.runs.assembly import assemble
    from dlrun.config import load_config
    from dlrun.errors import ConfigError

    monkeypatch.setattr(dlrun.backend.memory, "host_memory_available", lambda: 2**30)  # 1 GiB left
    cfg = load_config("configs/spiral.yaml", ["model[0].units=400000", "train.batch_size=null"])
    with pytest.raises(ConfigError) as e:  # 2 × (400000 + 400000 + 3) float32 outputs = 6.1 MiB a sample
        assemble(cfg)
    assert e.value.exit_code == 2 and str(e.value.where) == "--set train.batch_size=null: train.batch_size"
    assert e.value.message == ("a batch of 300 needs at least 1.8 GiB for the layers' outputs and "
                               "their gradients (6.1 MiB a sample), more than the 1.0 GiB of memory available; make "
                               "train.batch_size at most 167")
    assemble(load_config("configs/spiral.yaml", ["model[0].units=400000", "train.batch_size=167"]))  # fits


# -- in process (dlrun.cli.main): inputs too large, too deep or of the wrong kind -----------------
# One line on stderr, exit 2, within a bound of time (each ran for seconds to minutes, or ended in
# an internal error, before it was refused); no interpreter start-up per case.

_ALIAS_BOMB = ("{type: spiral, seed: [&a [1,1,1,1,1,1,1,1,1,1], " + ", ".join(
    f"&{n} [{','.join([f'*{p}'] * 10)}]" for p, n in zip("abcde", "bcdef")) + "]}")  # 10^6 values, 228 characters


def _cfg(data: str) -> str:
    return f"data: {data}\nmodel: [{{type: Linear, units: 2}}]\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """Files too large or of the wrong kind, made here rather than kept in the corpus, and a
    trained run for evaluate --data."""
    from dlrun.config import load_config
    from dlrun.runs.run import train

    d = tmp_path_factory.mktemp("bad_inputs")
    valid = (ROOT / C / "valid.yaml").read_text()
    write(d / "large.yaml", valid + ("# " + "x" * 77 + "\n") * 26_000)  # 2 MB of comments
    write(d / "values.yaml", valid + "extra: [" + "0, " * 10_000 + "]\n")
    write(d / "bigcell.csv", "1,2,0\n" + "1" * 140_000 + ",2,1\n")
    with open(d / "nul.csv", "wb") as f:  # 16 MiB of NUL bytes, sparse: only the first block may be read
        f.truncate(16 << 20)
    (d / "nul_late.csv").write_bytes(b"1,2,0\n3,4,1\n\x00\x00\x00\n")
    write(d / "long.csv", "1" * ((16 << 20) + 10))  # no line break
    np.savez(d / "zero.npz", x=np.zeros((10, 0)), y=np.zeros(10))
    for name in ("bigcell.csv", "nul.csv", "nul_late.csv", "long.csv", "zero.npz"):
        write(d / f"{name.split('.')[0]}.yaml", _cfg(f"{{type: file, path: {name}}}"))
    cfg = load_config(ROOT / C / "valid.yaml")
    train(cfg, d / "runs")
    (run,) = (d / "runs").iterdir()
    return {"tmp": d, "run": run}


IN_PROCESS_CASES = [
    # nesting, aliases and size: the limits a config file has, for --set and --data values too
    ("config_nested_3000", ["check", f"{C}/nested_3000.yaml"], ["nested_3000.yaml:9: the config nests lists and "
                                                                  "mappings more than 50 levels deep"]),
    ("set_nested_3000", ["check", f"{C}/valid.yaml", "--set", "seed=" + "[" * 3000 + "]" * 3000],
     ["--set seed=(a value of 6005 characters): seed: the value nests lists and mappings more than 50 levels deep"]),
    ("set_alias_loop", ["check", f"{C}/valid.yaml", "--set", "seed=&a [*a]"],
     ["--set seed=&a [*a]: seed: a YAML alias refers to a value that contains it"]),
    ("data_alias_loop", ["evaluate", "{run}", "--data", "{type: spiral, seed: &a [*a]}"],
     ["--data: a YAML alias refers to a value that contains it"]),
    ("data_alias_bomb", ["evaluate", "{run}", "--data", _ALIAS_BOMB],
     ["--data: the value expands to more than 100,000 values through YAML aliases"]),
    ("data_nested", ["evaluate", "{run}", "--data", "[" * 100 + "]" * 100],
     ["--data: the value nests lists and mappings more than 50 levels deep"]),
    ("config_too_large", ["check", "{tmp}/large.yaml"], ["large.yaml: the file is 2,0", "a config is a small text "
                                                         "file of settings (at most 1,048,576 bytes)"]),
    ("config_too_many_values", ["check", "{tmp}/values.yaml"], ["values.yaml:9: the config holds more than 10,000 "
                                                                "values"]),
    # config text
    ("config_not_utf8", ["check", f"{C}/not_utf8.yaml"], ["not_utf8.yaml:3: not UTF-8 text (byte 0xe9 at column 36)"]),
    ("config_control_char", ["check", f"{C}/control_char.yaml"], ["control_char.yaml:5: control character U+0001 at "
                                                                  "column 19"]),
    # data files
    ("data_cell_too_long", ["check", "{tmp}/bigcell.yaml"], ["bigcell.csv:2: a cell longer than 131,072 characters"]),
    ("data_nul_bytes", ["check", "{tmp}/nul.yaml"], ["nul.csv:1: a binary file, not CSV text (a NUL byte at byte 1)"]),
    ("data_nul_after_rows", ["check", "{tmp}/nul_late.yaml"], ["nul_late.csv:3: a binary file, not CSV text"]),
    ("data_line_too_long", ["check", "{tmp}/long.yaml"], ["long.csv:1: a line longer than 16,777,216 characters"]),
    ("data_zero_features", ["check", "{tmp}/zero.yaml"], ["zero.npz: array 'x' has shape (10, 0): samples without "
                                                          "features; expected at least one feature per sample"]),
    # a plugin layer that breaks the contract: named with the line of the method that did
    ("plugin_forward_dtype", ["check", f"{C}/plugin_float64_forward.yaml"],
     ["plugin_float64_forward.yaml:5: model[1] Float64Forward(): forward returned its output as shape (20, 4) "
      "float64; expected shape (20, 4) float32 on cpu (wrong_contract.py:13)"]),
    ("plugin_backward_shape", ["check", f"{C}/plugin_short_backward.yaml"],
     ["model[1] ShortBackward(): backward returned dx as shape (20, 1) float32; expected shape (20, 4) float32 on "
      "cpu (wrong_contract.py:27)"]),
    ("plugin_backward_shape_train", ["train", f"{C}/plugin_short_backward.yaml", "--runs-dir", "{tmp}/runs-plugin"],
     ["model[1] ShortBackward(): backward returned dx as shape (20, 1) float32", "(wrong_contract.py:27)"]),
]


@pytest.mark.parametrize("case,argv,fragments", IN_PROCESS_CASES, ids=[c[0] for c in IN_PROCESS_CASES])
def test_bad_input_in_process(case, argv, fragments, bad_inputs):
    r = run_cli(*(a.format(**bad_inputs) if a.startswith("{tmp}") or a == "{run}" else a for a in argv), cwd=ROOT)
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.splitlines()) == 1, r.err
    for f in fragments:
        assert f in r.err, f"{f!r} not in stderr:\n{r.err}"
    assert "Traceback" not in r.err + r.out
