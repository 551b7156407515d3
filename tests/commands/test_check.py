"""`dlrun check`: one batch forward/backward, per-layer shapes, parameters and memory."""
from __future__ import annotations

from conftest import ROOT, run_cli, write
from dlrun.commands.check import check_config
from dlrun.config import load_config

VALID = ROOT / "tests/corpus/configs/valid.yaml"  # spiral 2x10, Linear(4)-ReLU-Linear(2), batch 8


def test_report_counts_parameters_and_memory_by_hand():
    r = check_config(load_config(VALID))
    assert (r.batch_size, r.train_samples, r.input_shape) == (8, 20, (2,))
    lin0, relu, lin2 = r.layers
    assert (lin0.output_shape, lin0.params, lin0.param_bytes, lin0.grad_bytes) == ((4,), 12, 48, 48)
    # output 8x4 float32 plus the cached input 8x2 float32
    assert lin0.activation_bytes == 8 * 4 * 4 + 8 * 2 * 4
    # output 8x4 float32 plus the 0/1 mask 8x4 in float32; its input is Linear's output, counted already
    assert (relu.params, relu.activation_bytes) == (0, 8 * 4 * 4 + 8 * 4 * 4)
    assert (lin2.params, lin2.activation_bytes) == (10, 8 * 2 * 4)
    assert r.total_bytes == sum(x.param_bytes + x.grad_bytes + x.activation_bytes for x in r.layers)
    assert 0 < r.loss < 5


def test_conv_net_memory_follows_the_training_order_and_counts_views_once():
    """digits_cnn, batch 32: each ReLU runs on its pooled map (Sequential.order); MaxPool2D holds
    its output and, in training, the copy of its four sub-grids; Flatten returns a view."""
    from conftest import CONFIGS

    r = check_config(load_config(CONFIGS / "digits_cnn.yaml"))
    rows = {x.index: x for x in r.layers}
    assert r.batch_size == 32
    assert rows[1].activation_bytes == 2 * 32 * 32 * 4 * 4 * 4     # ReLU: y and mask on (32, 32, 4, 4)
    assert rows[2].activation_bytes == 5 * 32 * 32 * 4 * 4 * 4     # MaxPool2D: output + 4 sub-grids
    assert rows[6].activation_bytes == 0                            # Flatten: a view of ReLU's output


def test_cli_check_prints_table_and_writes_nothing(tmp_path):
    before = set(tmp_path.iterdir())
    r = run_cli("check", VALID, "--set", "train.batch_size=5", cwd=tmp_path)
    assert r.code == 0, r.err
    assert "batch N=5" in r.out and "Linear(units=4)" in r.out and "(N, 4)" in r.out
    assert "backward, one optimizer step: OK (nothing saved, nothing written)" in r.out
    assert set(tmp_path.iterdir()) == before


def test_cli_check_table_keeps_one_line_per_layer_in_80_columns(tmp_path):
    r = run_cli("check", ROOT / "configs/digits_cnn.yaml", cwd=tmp_path, env={"COLUMNS": "80"})
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    body = lines[next(i for i, s in enumerate(lines) if s.startswith("┡")) + 1:
                 next(i for i, s in enumerate(lines) if s.startswith("└"))]
    assert [s.split("│")[1].strip() for s in body] == [str(k) for k in range(9)]  # no wrapped rows
    assert all(len(s) <= 80 for s in lines if s.startswith(("┏", "│", "└")))
    assert "(N, 32, 8, 8)" in r.out and "336.0 KiB" in r.out  # shapes and figures whole
    assert "Conv2D(" in r.out and "…" in r.out  # the layer's options are what gets cut


LIAR = '''
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Liar(Layer):
    """y = x[:, :1], though build() says the shape is unchanged."""

    def forward(self, x, y=None):
        return x[:, :1]

    def backward(self, dy):
        return dy
'''


BAD_LAYERS = """\
import numpy as np
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Widens(Layer):
    def forward(self, x):
        return x.astype(np.float64)

    def backward(self, dy):
        return dy


@layers.register()
class RaisesInBackward(Layer):
    def forward(self, x):
        return x

    def backward(self, dy):
        return {}["gone"]
"""


def test_check_catches_a_layer_whose_build_lies(tmp_path):
    plugin = write(tmp_path / "liar.py", LIAR)
    cfg = write(tmp_path / "c.yaml", "data: {type: spiral, classes: 2, points_per_class: 5}\n"
                "model:\n  - Liar\n  - {type: Linear, units: 2}\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n")
    r = run_cli("check", cfg, "--plugin", plugin)
    assert r.code == 2, r.err
    # the contract check training makes on its first batch
    assert "c.yaml:3: model[0] Liar(): forward returned its output as shape (10, 1) float32; expected shape (10, 2)" in r.err


def test_check_and_time_name_what_training_would_refuse_or_a_layer_that_raises(tmp_path):
    """dlrun check said OK for a layer returning float64 in a float32 model (train refuses it), and a
    plugin layer that raised was an 'internal error' naming neither the layer nor its line."""
    plugin = write(tmp_path / "bad.py", BAD_LAYERS)
    head = "data: {type: spiral, classes: 2, points_per_class: 5}\nmodel:\n  - {type: Linear, units: 4}\n"
    tail = "  - {type: Linear, units: 2}\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n"
    wide = write(tmp_path / "wide.yaml", head + "  - Widens\n" + tail)
    raises = write(tmp_path / "raises.yaml", head + "  - RaisesInBackward\n" + tail)
    for command in ("check", "time", "train"):
        r = run_cli(command, wide, "--plugin", plugin, *(("--runs-dir", tmp_path / "runs") if command == "train" else ()))
        assert r.code == 2, (command, r.err)
        assert "model[1] Widens(): forward returned its output as shape (10, 4) float64; expected" in r.err, r.err
        r = run_cli(command, raises, "--plugin", plugin, *(("--runs-dir", tmp_path / "runs") if command == "train" else ()))
        assert r.code == 1 and "internal error" not in r.err, (command, r.err)
        assert "model[1] RaisesInBackward(): backward raised KeyError: 'gone' (bad.py:21)" in r.err, (command, r.err)
        assert "Traceback" not in r.err


def test_error_text_in_brackets_is_printed_not_taken_for_markup(cli, tmp_path):
    cfg = write(tmp_path / "bad.yaml", "model:\n  - type: Linear\n    units: '[gpu]'\nloss: SoftmaxCrossEntropy\n")
    r = cli("check", cfg)
    assert r.code == 2 and "'[gpu]'" in r.err, r.err
