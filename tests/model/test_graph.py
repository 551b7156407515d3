"""Graph models from the config: Residual and Parallel blocks, named nodes that read several
inputs, one layer's weights applied at several places. Oracles: float64 central differences
over the whole model, and the same computation written out with numpy."""
from __future__ import annotations

import numpy as np
import pytest

from dlrun.config import config_from_dict
from dlrun.errors import ConfigError, ConfigErrors, ShapeError
from dlrun.model import Sequential
from dlrun.model.graph import Graph
from dlrun.runs.assembly import build_model
from numgrad import numeric_grad

BASE = {"data": {"type": "spiral", "points_per_class": 10}, "loss": "SoftmaxCrossEntropy",
        "optimizer": {"type": "SGD", "learning_rate": 0.1}, "seed": 3}

# every form at once: a residual block with and without projection, parallel branches merged by
# concat and add, named nodes, a multi-input Multiply, and shared weights
EVERYTHING = [
    {"type": "Linear", "units": 5, "name": "stem"},
    "Tanh",
    {"type": "Residual", "body": [{"type": "Linear", "units": 5}, "Tanh", {"type": "Linear", "units": 5}]},
    {"type": "Residual", "body": [{"type": "Linear", "units": 4}, "Sigmoid"],
     "projection": {"type": "Linear", "units": 4}, "name": "res2"},
    {"type": "Parallel", "branches": [[{"type": "Linear", "units": 3}], [], [{"type": "Linear", "units": 2}, "Tanh"]],
     "merge": "concat"},
    {"type": "Linear", "units": 4, "name": "b"},
    {"type": "Linear", "units": 4, "inputs": ["b"], "name": "a"},
    {"type": "Multiply", "inputs": ["a", "b"], "name": "gated"},
    {"shares": "a", "inputs": ["gated"], "name": "again"},
    {"type": "Parallel", "branches": [["Tanh"], ["Sigmoid"]], "merge": "add", "name": "mix"},
    {"type": "Add", "inputs": ["stem", "stem"], "name": "twice"},
    {"type": "Linear", "units": 4, "inputs": ["twice"], "name": "c"},
    {"type": "Concatenate", "inputs": ["c", "mix"], "axis": -1},
    {"type": "Linear", "units": 3},
]


def _config(model, **more):
    return config_from_dict({**BASE, "model": model, **more})


def _model(model, dtype="float64", **kw):
    return build_model(_config(model), (2,), dtype=dtype, **kw)


def test_a_plain_list_stays_a_sequential_and_names_alone_keep_it_one():
    assert type(_model([{"type": "Linear", "units": 3}, "ReLU"])) is Sequential
    assert type(_model([{"type": "Linear", "units": 3, "name": "first"}, "ReLU"])) is Sequential
    assert isinstance(_model(EVERYTHING), Graph)


def test_every_gradient_of_a_graph_equals_central_differences():
    m = _model(EVERYTHING)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 2))
    g = rng.standard_normal((6, 3))
    m.train()

    def f():
        return float((m.forward(x) * g).sum())

    f()
    dx = m.backward(g.copy())
    grads = {n: p.grad.copy() for n, p in m.named_parameters()}
    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    for n, p in m.named_parameters():
        np.testing.assert_allclose(grads[n], numeric_grad(f, p.data), rtol=1e-6, atol=1e-8, err_msg=n)
    # the fast path (checks passed) gives the same gradients as the checked first pass
    f()
    m.backward(g.copy())
    for n, p in m.named_parameters():
        np.testing.assert_array_equal(p.grad, grads[n], err_msg=n)


def test_a_residual_block_is_its_input_plus_its_body():
    m = _model([{"type": "Linear", "units": 4}, {"type": "Residual", "body": [{"type": "Linear", "units": 4}, "Tanh"]}])
    x = np.random.default_rng(1).standard_normal((5, 2))
    w0, b0, w1, b1 = (p.data for _, p in m.named_parameters())
    h = x @ w0.T + b0 if w0.shape == (4, 2) else x @ w0 + b0
    body = np.tanh(h @ w1.T + b1 if w1.shape[1] == 4 else h @ w1 + b1)
    np.testing.assert_allclose(m.forward(x), h + body, rtol=1e-12)


def test_a_shared_node_uses_one_parameter_set_and_sums_its_gradients():
    model = [{"type": "Linear", "units": 2, "name": "enc"}, "Tanh", {"shares": "enc"}]
    m = _model(model)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.weight", "0.bias"]  # one set, the owner's
    w = m.layers[0].params["weight"]
    w.data[...] += 1.0  # an update of the owner is what the second application uses
    x = np.random.default_rng(2).standard_normal((4, 2))
    W, b = w.data, m.layers[0].params["bias"].data
    lin = (lambda a: a @ W.T + b) if W.shape[1] == 2 else None
    np.testing.assert_allclose(m.forward(x), lin(np.tanh(lin(x))), rtol=1e-12)
    assert m.summary()[2].params == 0 and "shares" in m.summary()[2].name


def _error(model, kind=ConfigError) -> str:
    with pytest.raises((kind, ConfigErrors)) as e:
        _model(model)
    return str(e.value)


def test_an_unknown_input_is_named_with_a_suggestion():
    msg = _error([{"type": "Linear", "units": 3, "name": "encoder"}, {"type": "Add", "inputs": ["encoder", "encodr"]}])
    assert "model[1].inputs[1]" in msg and "unknown input 'encodr'" in msg and "did you mean encoder?" in msg


def test_a_cycle_is_an_error_naming_its_nodes():
    msg = _error([{"type": "Linear", "units": 3, "name": "a", "inputs": ["b"]},
                  {"type": "Linear", "units": 3, "name": "b", "inputs": ["a"]},
                  {"type": "Linear", "units": 3, "inputs": ["b"]}])
    assert "cycle" in msg and "a (model[0])" in msg and "b (model[1])" in msg


def test_a_merge_of_incompatible_shapes_names_both_shapes_and_both_nodes():
    msg = _error([{"type": "Linear", "units": 3, "name": "a"}, {"type": "Linear", "units": 4, "name": "b", "inputs": ["input"]},
                  {"type": "Add", "inputs": ["a", "b"]}], ShapeError)
    assert "model[2]" in msg and "(3,) from model[0] (a) Linear" in msg and "(4,) from model[1] (b) Linear" in msg


def test_a_residual_body_that_changes_the_shape_asks_for_a_projection():
    msg = _error([{"type": "Linear", "units": 3}, {"type": "Residual", "body": [{"type": "Linear", "units": 5}]}],
                 ShapeError)
    assert "model[1]" in msg and "(5,) from model[1].body[0]" in msg and "projection" in msg


def test_an_unused_node_is_a_warning_and_left_out():
    cfg = _config([{"type": "Linear", "units": 3, "name": "a"}, {"type": "Linear", "units": 4, "name": "lost"},
                   {"type": "Linear", "units": 3, "inputs": ["a"]}])
    assert len(cfg.warnings) == 1 and "lost (model[1])" in cfg.warnings[0] and "left out" in cfg.warnings[0]
    assert [n.node.path for n in cfg.nodes] == ["model[0]", "model[2]"]


def test_a_multi_input_layer_in_a_chain_asks_for_its_inputs():
    msg = _error([{"type": "Linear", "units": 3}, "Add"])
    assert "Add takes 2 or more inputs, got 1" in msg and "model[1]" in msg


def test_set_addresses_a_node_by_name():
    cfg = config_from_dict({**BASE, "model": EVERYTHING}, overrides=["model.res2.body[0].units=6",
                                                                      "model.c.units=7"])
    assert cfg.raw["model"][3]["body"][0]["units"] == 6 and cfg.raw["model"][11]["units"] == 7
    with pytest.raises(ConfigError, match="no node named 'res3' .did you mean res2"):
        config_from_dict({**BASE, "model": EVERYTHING}, overrides=["model.res3.units=6"])


def test_a_backward_that_returns_one_gradient_for_two_inputs_is_named_with_its_node():
    from dlrun import registry
    from dlrun.errors import LayerContractError
    from dlrun.layers.base import InputSpec, Layer

    class HalfSum(Layer):
        """y = (a + b)/2, with a backward that forgets b."""

        num_inputs = 2
        input_spec = InputSpec(inputs=(("D",), ("D",)))

        def forward(self, a, b):
            return (a + b) / 2

        def backward(self, dy):
            return dy / 2

    registry.layers.register("TestHalfSum")(HalfSum)
    try:
        m = _model([{"type": "Linear", "units": 3, "name": "a"},
                    {"type": "Linear", "units": 3, "inputs": ["input"], "name": "b"},
                    {"type": "TestHalfSum", "inputs": ["a", "b"]}])
        x = np.ones((4, 2))
        m.forward(x)
        with pytest.raises(LayerContractError, match=r"model\[2\] HalfSum.*backward returned ndarray; expected a "
                                                     r"tuple of 2 gradients, one per input"):
            m.backward(np.ones((4, 3)))
    finally:
        registry.layers.unregister("TestHalfSum")


SIAMESE = [  # one input holding a pair: each half through one shared encoder, then compared
    {"type": "Slice", "start": 0, "stop": 2, "name": "left"},
    {"type": "Linear", "units": 3, "name": "encoder"},
    {"type": "Tanh", "name": "code1"},
    {"type": "Slice", "start": 2, "inputs": ["input"], "name": "right"},
    {"shares": "encoder", "name": "encoder2"},
    {"type": "Tanh", "name": "code2"},
    {"type": "Multiply", "inputs": ["code1", "code2"]},
    {"type": "Linear", "units": 2},
]


def test_a_siamese_pair_shares_one_encoder_and_its_gradient_sums_both_halves():
    m = build_model(_config(SIAMESE), (4,), dtype="float64")
    assert [n for n, _ in m.named_parameters()] == ["1.weight", "1.bias", "7.weight", "7.bias"]
    rng = np.random.default_rng(3)
    x, g = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    W, b = m.layers[1].params["weight"].data, m.layers[1].params["bias"].data
    code = [np.tanh(h @ W.T + b) for h in (x[:, :2], x[:, 2:])]
    V, c = m.layers[7].params["weight"].data, m.layers[7].params["bias"].data
    np.testing.assert_allclose(m.forward(x), (code[0] * code[1]) @ V.T + c, rtol=1e-12)

    def f():
        return float((m.forward(x) * g).sum())

    f()
    dx = m.backward(g.copy())
    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-6, atol=1e-8)
    for n, p in m.named_parameters():
        grad = p.grad.copy()
        np.testing.assert_allclose(grad, numeric_grad(f, p.data), rtol=1e-6, atol=1e-8, err_msg=n)


def test_an_embedding_that_reads_the_input_later_in_a_graph_has_its_indices_checked_first():
    # the input goes to a Linear (node 0) and to an Embedding (node 1): an index past the
    # Embedding's table is named with its sample before training, as for a chain's first layer
    from dlrun.data import Dataset
    from dlrun.errors import DataError
    from dlrun.training.preflight import check_model_indices

    model = build_model(_config([
        {"type": "Linear", "units": 2, "name": "lin"},
        {"type": "Embedding", "input_dim": 10, "output_dim": 2, "inputs": ["input"], "name": "emb"},
        {"type": "Flatten", "inputs": ["emb"]},
        {"type": "Linear", "units": 2, "name": "out"},
        {"type": "Add", "inputs": ["lin", "out"]},
    ]), (3,), dtype="float64")
    assert isinstance(model, Graph) and model.reads_input() == [0, 1]
    x = np.array([[1, 2, 3], [4, 12, 5]], dtype=np.float64)
    with pytest.raises(DataError, match=r"model\[1\] Embedding takes indices in \[0, 10\), got 12"):
        check_model_indices(Dataset(x, np.array([0, 1]), name="toy"), model)
    check_model_indices(Dataset(x % 10, np.array([0, 1]), name="toy"), model)  # in range: nothing to say
