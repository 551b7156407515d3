"""The checkpoint file: round trip, atomic write, and refusal of pickles and corrupt files."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from checkpoint_helpers import spiral_config, train
from conftest import run_cli
from dlrun.runs import checkpoint
from dlrun.errors import CheckpointError


def test_round_trip_and_no_temporary_files_left(tmp_path):
    model = {"0.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}
    optim = {"0.weight/velocity": np.ones((2, 3), np.float32), "iterations": np.asarray(7)}
    big = 2**100 + 3  # PCG64 states are 128-bit integers: JSON must keep them exact
    path = checkpoint.save(tmp_path / "c" / "x.npz", model, optim, {"epoch": 2, "rng": {"state": big}})
    m, o, meta = checkpoint.load(path)
    assert np.array_equal(m["0.weight"], model["0.weight"]) and m["0.weight"].dtype == np.float32
    assert int(o["iterations"]) == 7 and meta["rng"]["state"] == big and meta["epoch"] == 2
    assert [p.name for p in path.parent.iterdir()] == ["x.npz"]


class _Boom:
    def __reduce__(self):
        return (open, (str(_Boom.target), "w"))


def test_pickled_object_array_is_refused_without_running_it(tmp_path):
    _Boom.target = tmp_path / "pwned"
    bad = tmp_path / "evil.npz"
    obj = np.empty(1, dtype=object)
    obj[0] = _Boom()
    meta = np.frombuffer(json.dumps({"format": checkpoint.FORMAT}).encode(), dtype=np.uint8)
    np.savez(bad, meta=meta, **{"model/0.weight": obj})
    assert pickle.dumps(_Boom())  # the payload is real
    with pytest.raises(CheckpointError, match="pickled objects"):
        checkpoint.load(bad)
    r = run_cli("predict", bad, "--input", bad)
    assert r.code == 2 and "pickled objects; refusing to load it" in r.err
    assert not _Boom.target.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_meta", "bad_json"])
def test_corrupt_checkpoints_give_a_clear_error(tmp_path, damage):
    good = checkpoint.save(tmp_path / "good.npz", {"0.weight": np.zeros((40, 40), np.float32)}, {}, {"epoch": 1})
    bad = tmp_path / "bad.npz"
    data = good.read_bytes()
    if damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        bad.write_bytes(b"not a zip file at all" * 10)
    elif damage == "no_meta":
        np.savez(bad, x=np.zeros(3))
    else:
        np.savez(bad, meta=np.frombuffer(b"{not json", dtype=np.uint8))
    with pytest.raises(CheckpointError) as e:
        checkpoint.load(bad)
    assert str(bad) in str(e.value)
    assert "corrupt" in str(e.value) or "not a dlrun checkpoint" in str(e.value)


@pytest.mark.slow
def test_cli_reports_a_truncated_checkpoint_with_exit_2(tmp_path):
    run = train(spiral_config(tmp_path, epochs=1), tmp_path / "runs")
    last = run / "checkpoints" / "last.npz"
    last.write_bytes(last.read_bytes()[:200])
    (run / "checkpoints" / "best.npz").unlink()
    np.save(tmp_path / "x.npy", np.zeros((1, 2)))
    for args in (("predict", run, "--input", tmp_path / "x.npy"), ("evaluate", run), ("train", "--resume", run)):
        r = run_cli(*args)
        assert r.code == 2, (args, r.err)
        assert "corrupt or truncated checkpoint" in r.err and "Traceback" not in r.err


def test_run_directory_without_checkpoints_is_explained(tmp_path):
    r = run_cli("predict", tmp_path, "--input", tmp_path / "x.npy")
    assert r.code == 2 and "no checkpoints/best.npz or checkpoints/last.npz" in r.err
