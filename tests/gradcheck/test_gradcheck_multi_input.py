"""Layers with several inputs: the contract (forward receives them, backward returns one gradient
per input), `dlrun gradcheck LAYER` checking every input's gradient, and the two-input plugin of
docs/custom-layers.md end to end (against torch.nn.Bilinear, gradcheck, a graph config)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, run_cli, write
from dlrun.backend import CPU
from dlrun.gradcheck import FAIL, PASS, check_layer
from dlrun.registry.plugins import load_plugins

PLUGIN = ROOT / "examples" / "bilinear.py"


def test_the_two_input_plugin_equals_torch_bilinear_in_float64():
    torch = pytest.importorskip("torch")
    from dlrun import registry

    load_plugins([str(PLUGIN)])  # (a file runs once per process: the schema tests load it too)
    layer = registry.layers.build({"type": "MyBilinear", "units": 3}, "test")
    layer.setup(CPU, np.float64, np.random.default_rng(0))
    assert layer.build((4,), (5,)) == (3,)
    rng = np.random.default_rng(1)
    a, b, dy = rng.standard_normal((6, 4)), rng.standard_normal((6, 5)), rng.standard_normal((6, 3))
    layer.bias.data[...] = rng.standard_normal(3)
    ref = torch.nn.Bilinear(4, 5, 3).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(layer.weight.data))
        ref.bias.copy_(torch.from_numpy(layer.bias.data))
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    out = ref(ta, tb)
    out.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(layer.forward(a, b), out.detach().numpy(), rtol=1e-12)
    da, db = layer.backward(dy)
    np.testing.assert_allclose(da, ta.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(layer.weight.grad, ref.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(layer.bias.grad, ref.bias.grad.numpy(), rtol=1e-10)


@pytest.mark.slow
def test_the_documented_workflow_checks_and_trains_the_two_input_plugin(tmp_path):
    r = run_cli("gradcheck", "MyBilinear", "--plugin", PLUGIN)
    assert r.code == 0, r.out
    assert "RESULT MyBilinear: PASS" in r.out
    r = run_cli("gradcheck", ROOT / "examples" / "bilinear.yaml", "--set", "data.points_per_class=10")
    assert r.code == 0, r.out
    assert "RESULT model[4] MyBilinear: PASS" in r.out
    r = run_cli("train", ROOT / "examples" / "bilinear.yaml", "--runs-dir", tmp_path)
    assert r.code == 0, r.err
    assert "a, b" in r.out  # the table lists the node's two inputs
    summary = json.loads((tmp_path / r.out.strip().splitlines()[-1].split("/")[-1] / "summary.json").read_text())
    assert summary["train_accuracy"] >= 0.97


BROKEN = '''
from dlrun.api import InputSpec, Layer, layers


@layers.register()
class Gate(Layer):
    """y = a ⊙ sigmoid(b)."""

    num_inputs = 2
    input_spec = InputSpec(inputs=(("D", "C"), ("D", "C")))

    def forward(self, a, b):
        self._a, self._s = a, 1 / (1 + self.xp.exp(-b))
        return a * self._s

    def backward(self, dy):
        a, s = self._a, self._s
        return BACKWARD
'''


@pytest.mark.parametrize("backward, fails", [
    ("dy * s, dy * a * s * (1 - s)", None),          # right
    ("dy * s, dy * a * s", "x"),                      # the second input's gradient is wrong
    ("dy * a * s * (1 - s), dy * s", "x"),            # the gradients in the wrong order
    ("dy * s", "error"),                              # one gradient for two inputs
])
def test_gradcheck_checks_every_input_gradient_of_a_plugin(tmp_path, backward, fails):
    plugin = write(tmp_path / "gate.py", BROKEN.replace("BACKWARD", backward))
    r = run_cli("gradcheck", "Gate", "--plugin", plugin)
    if fails is None:
        assert r.code == 0 and "RESULT Gate: PASS" in r.out, r.out + r.err
    elif fails == "error":
        assert r.code == 2 and "backward returned one ndarray" in r.out and "tuple of 2 gradients" in r.out, r.out
    else:
        assert r.code == 1 and "RESULT Gate: FAIL (x" in r.out, r.out


def test_a_forward_that_does_not_take_its_inputs_is_refused_when_the_plugin_loads(tmp_path):
    plugin = write(tmp_path / "gate.py", BROKEN.replace("BACKWARD", "dy, dy").replace(
        "def forward(self, a, b):", "def forward(self, a):").replace("return a * self._s", "return a").replace(
        "self._a, self._s = a, 1 / (1 + self.xp.exp(-b))", "self._a = self._s = a"))
    r = run_cli("gradcheck", "Gate", "--plugin", plugin)
    assert r.code == 2 and "num_inputs = 2" in r.err and "forward(self, x1, x2)" in r.err, r.err


@pytest.mark.parametrize("name", ["Add", "Multiply", "Concatenate"])
def test_the_built_in_merge_layers_pass_gradcheck_on_every_input(name):
    report = check_layer(name)
    assert report.verdict == PASS, report.error
    assert report.tensors[0].name == "x" and report.tensors[0].status == PASS
    assert FAIL not in {a.status for a in report.aux}


GRAPH = """\
seed: 1
data: {type: spiral, classes: 3, points_per_class: 20}
model:
  - {type: Linear, units: 6, name: stem}
  - type: Residual
    body: [{type: Linear, units: 6}, Tanh, {type: Linear, units: 6}]
  - type: Parallel
    branches: [[{type: Linear, units: 3}], [{type: Linear, units: 3}, Sigmoid]]
  - {type: Linear, units: 6, name: tied}
  - {type: Multiply, inputs: [tied, stem]}
  - {shares: tied}
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: SGD, learning_rate: 0.1}
"""


def test_gradcheck_config_checks_a_whole_graph_then_every_node(tmp_path):
    r = run_cli("gradcheck", write(tmp_path / "g.yaml", GRAPH), "--json")
    assert r.code == 0, r.out
    import json

    j = json.loads(r.out)
    names = [t["name"] for t in j["tensors"]]
    assert "9.weight" in names and "10.weight" not in names  # the shared layer: one tensor, its uses summed
    layers = [c["layer"] for c in j["children"]]
    assert "model[1] Add" in layers and "model[2] Concatenate" in layers and "model[4] Multiply" in layers
    assert "model[1].body[0] Linear" in layers and "model[5] Linear" not in layers  # (the shared node: once)
    assert all(c["result"] == "PASS" for c in j["children"]) and j["result"] == "PASS"
