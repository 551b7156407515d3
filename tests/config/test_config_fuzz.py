"""Property test: mutated configs never crash dlrun; they validate or raise a DlrunError.

The CLI maps DlrunError to a one-line message and exit 2 (or 1), and anything else to a
traceback-free 'internal error' with exit 1, so the oracle is: no exception other than
DlrunError escapes the library, and a real `dlrun check` run on a sample shows no traceback.
"""
from __future__ import annotations

import copy

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from conftest import run_cli, write  # noqa: E402
from dlrun.commands.check import check_config  # noqa: E402
from dlrun.config import load_config  # noqa: E402
from dlrun.errors import DlrunError  # noqa: E402

VALID = {
    "seed": 0,
    "data": {"type": "spiral", "classes": 2, "points_per_class": 6},
    "model": [{"type": "Linear", "units": 4, "weight_initializer": "he_normal"}, "ReLU", {"type": "Linear", "units": 2}],
    "loss": "SoftmaxCrossEntropy",
    "optimizer": {"type": "SGD", "learning_rate": 0.1, "momentum": 0.9},
    "regularizer": {"type": "L2", "strength": 1e-4},
    "train": {"epochs": 1, "batch_size": 4, "validation_split": 0.25},
}
VALUES = st.sampled_from([None, "x", "ReLU", -1, 0, 1, 2.5, -0.5, 1e30, True, [], {}, [1, 2], {"type": "Nope"},
                          {"type": "Linear"}, "1e-3", float("nan")])


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated(draw):
    cfg = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(cfg) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = cfg
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        op = draw(st.sampled_from(["delete", "rename", "replace"]))
        if op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[key + draw(st.sampled_from(["s", "_", "x"]))] = parent.pop(key)
        else:
            parent[key] = copy.deepcopy(draw(VALUES))  # never mutate the shared sample values
    return cfg


# derandomize: the same 60 mutations every run, so a CI failure reproduces (a random draw once
# found spiral(classes=1e30) crashing; it is now a fixed case below)
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=mutated())
def test_mutated_configs_raise_only_dlrun_errors(tmp_path, cfg):
    path = write(tmp_path / "m.yaml", yaml.safe_dump(cfg))
    try:
        check_config(load_config(path))
    except DlrunError as e:
        assert str(e).strip()  # a message, never empty
        assert e.exit_code in (1, 2)


@pytest.mark.parametrize("where, key, value, says", [
    ("data", "classes", 1e30, "options too large (classes=1000000000000000019884624838656"),
    ("data", "points_per_class", 10**15, "Unable to allocate"),  # beyond any address space
    ("model", "units", 10**15, "of memory available"),  # refused by add_param before numpy is asked
])
def test_sizes_too_large_for_memory_are_config_errors(tmp_path, where, key, value, says):
    cfg = copy.deepcopy(VALID)
    (cfg["data"] if where == "data" else cfg["model"][0])[key] = value
    path = write(tmp_path / "big.yaml", yaml.safe_dump(cfg))
    with pytest.raises(DlrunError) as err:
        check_config(load_config(path))
    assert err.value.exit_code == 2 and says in str(err.value)
    assert "big.yaml:" in str(err.value)  # names the file and line


@pytest.mark.slow
def test_mutated_configs_through_the_cli_print_no_traceback(tmp_path):
    """A few fixed mutations through the real `dlrun check` (one run each)."""
    cases = []
    for mutate in (lambda c: c["model"].__setitem__(0, {"type": "Linear", "units": None}),
                   lambda c: c["train"].__setitem__("batch_size", []),
                   lambda c: c.__setitem__("data", {"type": "spiral", "classes": {}}),
                   lambda c: c.__setitem__("optimizer", [1, 2])):
        c = copy.deepcopy(VALID)
        mutate(c)
        cases.append(c)
    for i, c in enumerate(cases):
        r = run_cli("check", write(tmp_path / f"m{i}.yaml", yaml.safe_dump(c)))
        assert r.code in (0, 1, 2) and "Traceback" not in r.err and "internal error" not in r.err, r.err
