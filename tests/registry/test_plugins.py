"""User plugins: --plugin on every command that builds layers, config plugins:, entry points,
and errors that name the file."""
from __future__ import annotations

import pytest

from conftest import ROOT, write

LAYER = '''
from dlrun.layers import InputSpec, Layer
from dlrun.registry import layers


@layers.register()
class Triple(Layer):
    """y = 3x."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        return 3 * x

    def backward(self, dy):
        return 3 * dy
'''

BAD = {
    "notlayer.py": ("from dlrun.registry import layers\n\n@layers.register()\nclass Foo:\n    pass\n",
                    "notlayer.py:3: layer 'Foo' does not follow the layer contract: it is not a subclass of dlrun.layers.Layer"),
    "nobackward.py": ("from dlrun.registry import layers\nfrom dlrun.layers import Layer\n\n@layers.register()\n"
                      "class Foo(Layer):\n    def forward(self, x):\n        return x\n",
                      "nobackward.py:4: layer 'Foo' does not follow the layer contract: it does not implement backward"),
    "kwargs.py": ("from dlrun.registry import layers\nfrom dlrun.layers import Layer\n\n@layers.register()\n"
                  "class Foo(Layer):\n    def __init__(self, **options):\n        pass\n",
                  "kwargs.py:4: layer 'Foo': options must be explicit keyword parameters"),
    "duplicate.py": ("from dlrun.registry import layers\nfrom dlrun.layers import Layer\n\n@layers.register()\n"
                     "class ReLU(Layer):\n    pass\n", "duplicate.py:4: layer 'ReLU' is already registered (by builtin)"),
    "caseclash.py": ("from dlrun.registry import layers\nfrom dlrun.layers import Layer\n\n@layers.register()\n"
                     "class linear(Layer):\n    pass\n",
                     "caseclash.py:4: layer 'linear' differs from the registered 'Linear' (by builtin) only in case"),
    "syntax.py": ("def f(:\n", "syntax.py:1: syntax error in plugin"),
    "raises.py": ("x = 1\nraise RuntimeError('boom')\n", "raises.py:2: plugin raised RuntimeError: boom"),
}


@pytest.mark.parametrize("file", list(BAD))
def test_plugin_errors_name_the_file_and_line(cli, tmp_path, file):
    text, expected = BAD[file]
    write(tmp_path / file, text)
    r = cli("list", "layers", "--plugin", file, cwd=tmp_path)  # named as given, relative, like the other errors
    assert r.code == 2 and r.err.startswith(f"error: {expected}"), r.err
    assert "Traceback" not in r.err


def test_missing_plugin_file(cli, tmp_path):
    r = cli("gradcheck", "Triple", "--plugin", tmp_path / "nope.py")
    assert r.code == 2 and "plugin file not found" in r.err and "nope.py" in r.err


def test_failed_plugin_leaves_nothing_registered(tmp_path):
    from dlrun import registry
    from dlrun.errors import PluginError
    from dlrun.registry.plugins import load_plugin

    path = write(tmp_path / "half.py", LAYER.replace("Triple", "HalfLoaded") + "\nraise ValueError('late')\n")
    with pytest.raises(PluginError, match="half.py:.*late"):
        load_plugin(path)
    assert "HalfLoaded" not in registry.layers


def test_plugin_on_list_show_gradcheck_and_train(cli, tmp_path):
    plugin = write(tmp_path / "triple.py", LAYER)
    assert "Triple" in cli("list", "layers", "--plugin", plugin).out
    assert "y = 3x" in cli("show", "Triple", "--plugin", plugin).out
    assert cli("gradcheck", "Triple", "--plugin", plugin).code == 0
    config = write(tmp_path / "c.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 10}\nmodel:\n"
                   "  - {type: Linear, units: 3}\n  - Triple\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n"
                   "train: {epochs: 2}\n")
    r = cli("train", config, "--plugin", plugin, "--runs-dir", tmp_path / "runs")
    assert r.code == 0, r.err
    r = cli("train", config, "--runs-dir", tmp_path / "runs")
    assert r.code == 2 and "unknown layer 'Triple'" in r.err


def test_config_plugins_are_relative_to_the_config(cli, tmp_path):
    write(tmp_path / "sub" / "triple.py", LAYER)
    config = write(tmp_path / "sub" / "c.yaml", "seed: 0\nplugins: [triple.py]\ndata: {type: spiral, points_per_class: 10}\n"
                   "model:\n  - {type: Linear, units: 3}\n  - Triple\nloss: SoftmaxCrossEntropy\noptimizer: SGD\n"
                   "train: {epochs: 2}\n")
    r = cli("gradcheck", config)
    assert r.code == 0 and "model[1] Triple: PASS" in r.out, r.out + r.err


def test_entry_point_plugins_load_from_installed_packages(cli, tmp_path):
    site = tmp_path / "site"
    write(site / "tripleplug.py", LAYER)
    write(site / "tripleplug-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: tripleplug\nVersion: 1.0\n")
    write(site / "tripleplug-1.0.dist-info" / "entry_points.txt", "[dlrun.plugins]\ntriple = tripleplug\n")
    import os

    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}  # (installed packages are found as a process starts)
    r = cli("list", "layers", env=env, process=True)
    assert r.code == 0 and "Triple" in r.out and "entry point triple" in r.out, r.out + r.err
    assert cli("gradcheck", "Triple", env=env, process=True).code == 0


def test_an_entry_point_plugin_that_raises_is_named_like_a_plugin_file(cli, tmp_path):
    """Only --plugin and plugins: files counted as plugin code when naming what raised: an
    installed package's component that raised was an 'internal error'."""
    site = tmp_path / "site"
    write(site / "typoplug.py", "from dlrun.registry import optimizers\n\n\n@optimizers.register()\n"
                                "class TypoSGD(optimizers.base):\n    \"\"\"SGD reading a missing attribute.\n\n"
                                "    Args:\n        learning_rate: the step size.\n    \"\"\"\n\n"
                                "    def __init__(self, learning_rate: float = 0.1):\n        super().__init__(learning_rate)\n\n"
                                "    def _update(self, state, p):\n        p.data -= self.lr * p.grad\n")
    write(site / "typoplug-1.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: typoplug\nVersion: 1.0\n")
    write(site / "typoplug-1.0.dist-info" / "entry_points.txt", "[dlrun.plugins]\ntypo = typoplug\n")
    cfg = write(tmp_path / "c.yaml", "data: {type: spiral, points_per_class: 20}\nmodel: [{type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: TypoSGD\n")
    import os

    r = cli("check", cfg, env={"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}, process=True)
    assert r.code == 1 and "internal error" not in r.err, r.err
    assert "the optimizer 'TypoSGD': _update raised AttributeError: 'TypoSGD' object has no attribute 'lr' (typoplug.py:16)" in r.err


def test_a_plugin_importing_a_module_dlrun_no_longer_has_is_pointed_at_dlrun_api(cli, tmp_path):
    plugin = write(tmp_path / "old.py", "from dlrun.options import PositiveInt\n")
    r = cli("list", "layers", "--plugin", plugin)
    assert r.code == 2 and "old.py:1: plugin raised ModuleNotFoundError" in r.err, r.err
    assert "import what a plugin needs from dlrun.api" in r.err and len(r.err.splitlines()) == 1, r.err
