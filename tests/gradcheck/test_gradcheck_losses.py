"""`dlrun gradcheck LOSS` / `REGULARIZER`: a registered loss's backward against central differences
of its value, a regularizer's add_gradient against its penalty's, with planted bugs in plugins
(each must FAIL on the check that names it)."""
from __future__ import annotations

import json

from conftest import ROOT, write

BROKEN = '''
import numpy as np
from dlrun.losses import Loss
from dlrun.registry import losses


@losses.register()
class HalfMSE(Loss):
    """Mean squared error whose backward forgets the factor 2."""

    task = "regression"

    def forward(self, z, y):
        self._d = z - y
        return (self._d ** 2).mean()

    def backward(self):
        return self._d / self._d.size


@losses.register()
class RowGrad(HalfMSE):
    """Backward returns one value per row instead of the gradient's (N, C)."""

    def backward(self):
        return (2 * self._d / self._d.size).sum(axis=1)


@losses.register()
class Accumulates(HalfMSE):
    """Backward adds into an array kept across steps (a backward that follows each forward once,
    as in training, may keep state per forward; this keeps it across them)."""

    _g = None

    def backward(self):
        g = 2 * self._d / self._d.size
        if self._g is None or self._g.shape != g.shape:
            self._g = np.zeros_like(g)
        self._g += g
        return self._g


@losses.register()
class ShiftsInput(HalfMSE):
    """Forward subtracts the targets from the scores in place."""

    def forward(self, z, y):
        z -= 0.0 * y + 1e-3
        return super().forward(z, y)


@losses.register()
class PerSample(HalfMSE):
    """Forward returns one loss per row, not the batch mean."""

    def forward(self, z, y):
        self._d = z - y
        return (self._d ** 2).mean(axis=1)
'''


def _json(cli, *args):
    r = cli("gradcheck", *args, "--json")
    return r.code, (json.loads(r.out) if r.out.strip() else None), r.err


def test_every_builtin_loss_passes_and_names_its_shapes(cli):
    for name, shape in (("SoftmaxCrossEntropy", [7, 4]), ("Hinge", [7, 4]), ("MSE", [7, 4]),
                        ("BinaryCrossEntropy", [7, 1])):  # binary: one score column, labels 0/1
        code, j, err = _json(cli, name)
        assert code == 0 and j["result"] == "PASS", (name, err)
        z = j["tensors"][0]
        assert z["name"] == "z" and z["shape"][0] == shape and z["checked"] > 0
        assert {a["name"]: a["status"] for a in j["aux"]}["reentrant"] == "PASS"


def test_planted_loss_bugs_fail_on_the_check_that_names_them(cli, tmp_path):
    plugin = write(tmp_path / "broken.py", BROKEN)
    code, j, _ = _json(cli, "HalfMSE", "--plugin", plugin)
    z = j["tensors"][0]
    assert code == 1 and z["status"] == "FAIL" and abs(2 * z["worst"]["analytic"] - z["worst"]["numeric"]) < 1e-6
    code, j, _ = _json(cli, "RowGrad", "--plugin", plugin)
    assert code == 1 and "grad shape (7,) != input shape (7, 4)" in json.dumps(j)
    for name, check in (("Accumulates", "reentrant"), ("ShiftsInput", "inputs-unchanged")):
        code, j, _ = _json(cli, name, "--plugin", plugin)
        assert code == 1 and check in j["failed"], (name, j["failed"])
    r = cli("gradcheck", "PerSample", "--plugin", plugin)
    assert r.code == 2 and "forward returned shape (7,), expected a scalar" in r.out + r.err


def test_hinge_kinks_need_detection_at_a_coarse_step(cli):
    # the hinge's kinks (a score within the margin of the true score) lie within 0.2 of several
    # N(0,1) scores: a two-sided difference across one is wrong; --detect-kinks skips those
    args = ("Hinge", "--eps", "0.2", "--resample", "0")
    code, j, _ = _json(cli, *args)
    assert code == 1 and j["tensors"][0]["status"] == "FAIL"
    code, j, _ = _json(cli, *args, "--detect-kinks")
    assert code == 0 and j["tensors"][0]["skipped"] > 0


def test_loss_names_options_and_all(cli):
    r = cli("gradcheck", "SoftmaxCrossEntrpy")
    assert r.code == 2 and "did you mean SoftmaxCrossEntropy" in r.err and "losses: " in r.err
    r = cli("gradcheck", "Hinge", "--set", "margn=0.5")
    assert r.code == 2 and "did you mean margin" in r.err
    assert cli("gradcheck", "Hinge", "--set", "margin=0.5").code == 0
    r = cli("gradcheck", "--all")
    assert r.code == 0 and "layers, 6 losses, 2 regularizers)" in r.out and "SoftmaxCrossEntropy" in r.out


def test_the_documented_custom_loss_passes_and_its_sign_bug_fails(cli, tmp_path):
    text = (ROOT / "docs" / "custom-layers.md").read_text()
    code = text.split("## Your own loss", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert cli("gradcheck", "SquaredHinge", "--plugin", write(tmp_path / "my_loss.py", code)).code == 0
    flipped = code.replace("= -dz.sum(axis=1)", "= dz.sum(axis=1)")
    assert flipped != code
    assert cli("gradcheck", "SquaredHinge", "--plugin", write(tmp_path / "flipped.py", flipped)).code == 1


def test_a_config_check_also_checks_its_loss_on_its_own(cli, tmp_path):
    write(tmp_path / "broken.py", BROKEN)
    config = write(tmp_path / "c.yaml", f"seed: 0\nplugins: [broken.py]\n"
                   f"data: {{type: file, path: {ROOT / 'configs' / 'data' / 'regression.csv'}, task: regression}}\n"
                   "model: [{type: Linear, units: 4}, Tanh, {type: Linear, units: 1}]\n"
                   "loss: HalfMSE\noptimizer: SGD\ntrain: {epochs: 1}\n")
    code, j, err = _json(cli, config)
    assert code == 1, err
    children = {c["layer"]: c["result"] for c in j["children"]}
    assert children["loss HalfMSE"] == "FAIL" and children["model[0] Linear"] == "PASS"
    assert "loss HalfMSE: z, grad-structure" in j["failed"]
    assert "the loss's backward returned shape (8, 8), expected the model output's (8, 1)" in j["error"]  # its targets (N,) broadcast z - y to (N, N)


REGULARIZERS = '''
from dlrun.registry import regularizers
from dlrun.api import Regularizer


@regularizers.register()
class HalfL2(Regularizer):
    """strength · Σ w², whose gradient forgets the factor 2."""

    def __init__(self, strength: float = 1e-4):
        self.strength = strength

    def penalty(self, w):
        return self.strength * float((w * w).sum())

    def add_gradient(self, w, grad):
        grad += self.strength * w


@regularizers.register()
class Overwrites(HalfL2):
    """The right increment, assigned instead of added."""

    def add_gradient(self, w, grad):
        grad[...] = 2 * self.strength * w


@regularizers.register()
class ClipsWeights(HalfL2):
    """A correct gradient, but the penalty clips w in place."""

    def penalty(self, w):
        w[w > 1] = 1
        return self.strength * float((w * w).sum())

    def add_gradient(self, w, grad):
        grad += 2 * self.strength * w
'''


def test_regularizers_are_checked_at_strength_1_unless_set(cli, tmp_path):
    for name in ("L1", "L2"):
        code, j, err = _json(cli, name)
        assert code == 0 and j["settings"]["strength"] == 1.0, err
        assert {a["name"]: a["status"] for a in j["aux"]}["adds-gradient"] == "PASS"
    code, j, _ = _json(cli, "L2", "--set", "strength=0.25")
    assert code == 0 and j["settings"]["strength"] == 0.25
    plugin = write(tmp_path / "regs.py", REGULARIZERS)
    code, j, _ = _json(cli, "HalfL2", "--plugin", plugin)
    w = j["tensors"][0]
    assert code == 1 and w["name"] == "w" and abs(2 * w["worst"]["analytic"] - w["worst"]["numeric"]) < 1e-6
    for name, check in (("Overwrites", "adds-gradient"), ("ClipsWeights", "inputs-unchanged")):
        code, j, _ = _json(cli, name, "--plugin", plugin)
        assert code == 1 and check in j["failed"], (name, j["failed"])
    r = cli("gradcheck", "L11")
    assert r.code == 2 and "did you mean L1" in r.err and "regularizers: L1, L2" in r.err


def test_check_all_reports_progress_before_each_check():
    from dlrun import registry
    from dlrun.gradcheck import check_all

    seen = []
    reports = check_all(names=["ReLU", "Linear"], on_start=lambda name, i, n: seen.append((name, i, n)))
    expected = ["ReLU", "Linear", *registry.losses.names(), *registry.regularizers.names()]
    assert seen == [(name, i + 1, len(expected)) for i, name in enumerate(expected)]
    assert [r.layer for r in reports] == expected


def test_a_loss_or_penalty_that_raises_is_named_with_its_line(cli, tmp_path):
    """Layers' errors carried their plugin's file:line; a loss's or a regularizer's did not."""
    plugin = write(tmp_path / "raising.py", '''
import numpy as np
from dlrun.losses import Loss
from dlrun.registry import losses, regularizers
from dlrun.api import Regularizer


@losses.register()
class IndexPast(Loss):
    """A loss whose forward indexes past the scores."""

    def forward(self, z, y):
        return float(z[np.arange(len(y)), y + 10].mean())

    def backward(self):
        return None


@regularizers.register()
class Misspelt(Regularizer):
    """A regularizer with a typo in its penalty."""

    def __init__(self, strength: float = 0.1):
        self.strength = strength

    def penalty(self, w):
        return self.strenght * float((w * w).sum())

    def add_gradient(self, w, grad):
        grad += 2 * self.strength * w
''')
    r = cli("gradcheck", "IndexPast", "--plugin", plugin)
    assert r.code == 2 and "forward raised IndexError: index" in r.out + r.err and "(raising.py:13)" in r.out + r.err
    r = cli("gradcheck", "Misspelt", "--plugin", plugin)
    assert r.code == 2 and "penalty raised AttributeError" in r.out + r.err and "(raising.py:27)" in r.out + r.err


def test_a_gradient_of_the_wrong_shape_is_not_reported_as_a_happy_worst_element(cli, tmp_path):
    """(N, 1) scores against (N,) targets broadcast to (N, N): the tensor FAILs on its shape, and
    its line said 'z: happy; worst z[4,1]: analytic ..., numeric ...' above the reason."""
    plugin = write(tmp_path / "mse.py", '''
from dlrun.losses import Loss
from dlrun.registry import losses


@losses.register()
class UnshapedMSE(Loss):
    """MSE that forgets to reshape y."""

    task = "regression"

    def forward(self, z, y):
        self._d = z - y
        return float((self._d ** 2).mean())

    def backward(self):
        return 2 * self._d / self._d.size
''')
    r = cli("gradcheck", "UnshapedMSE", "--plugin", plugin)
    assert r.code == 1, r.out + r.err
    assert "z: FAIL for the reason below; where compared, backward and the differences agree" in r.out
    assert "happy; worst" not in r.out and "grad shape (7, 7) != input shape (7, 1)" in r.out


def test_a_loss_that_changes_its_scores_in_place_is_not_differenced(cli, tmp_path):
    """Each forward moved z by −y, so the differences were of no one function ('analytic -0.0857,
    numeric -5.5e7'); a layer that mutates its input already stopped there."""
    plugin = write(tmp_path / "inplace.py", '''
from dlrun.losses import Loss
from dlrun.registry import losses


@losses.register()
class InplaceMSE(Loss):
    """MSE that subtracts the targets from the scores in place."""

    task = "regression"

    def forward(self, z, y):
        z -= y.reshape(z.shape)
        self._d = z
        return float((z ** 2).mean())

    def backward(self):
        return 2 * self._d / self._d.size
''')
    r = cli("gradcheck", "InplaceMSE", "--plugin", plugin)
    assert r.code == 1, r.out + r.err
    assert "z: not compared: forward/backward modify z in place" in r.out and "numeric" not in r.out
    assert "inputs-unchanged  FAIL  z modified in place by forward/backward" in r.out
