"""memory_map: .npy samples read from the file a batch at a time train exactly as the same
samples read into memory, and never hold the whole file."""
from __future__ import annotations

import csv
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write
from dlrun.config import load_config
from dlrun.data import load_data
from dlrun.data import files, mapped, pieces
from dlrun.data.files import load_file
from dlrun.data.mapped import MappedFile, Rows
from dlrun.errors import DataError

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
data: {type: file, path: d.npy, label_column: %d, memory_map: %s}
model:
  - {type: Linear, units: 6}
  - Tanh
  - {type: Linear, units: 3}
loss: SoftmaxCrossEntropy
optimizer: {type: Adam, learning_rate: 0.05}
train: {epochs: 3, batch_size: 16, validation_split: 0.25, shuffle: %s}
seed: 3
"""


def _array(n=101, features=4, label_column=-1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features))
    y = rng.integers(0, 3, n).astype(np.float64)
    lc = label_column % (features + 1)
    return np.insert(x, lc, y, axis=1), x, y


@pytest.mark.parametrize("label_column", [-1, 0, 2])
@pytest.mark.parametrize("order", ["C", "F"])
def test_rows_index_as_the_array_does(tmp_path, label_column, order):
    whole, x, y = _array(label_column=label_column)
    np.save(tmp_path / "d.npy", np.asfortranarray(whole) if order == "F" else whole)
    rows = Rows(MappedFile(tmp_path / "d.npy"), label_column)
    assert rows.shape == x.shape and len(rows) == len(x) and np.array_equal(rows.labels(), y)
    rng = np.random.default_rng(1)
    for key in (5, -1, slice(None), slice(10, 40), slice(90, 200), slice(3, 60, 7), rng.permutation(101)[:30],
                np.array([7, 7, 2]), rng.random(101) < 0.3):
        assert np.array_equal(rows[key], x[key]), key
    keep = np.sort(rng.choice(101, 60, replace=False))
    part = rows.subset(keep)
    assert np.array_equal(np.asarray(part), x[keep]) and np.array_equal(part.labels(), y[keep])
    pick = rng.permutation(60)[:17]
    assert np.array_equal(part[pick], x[keep][pick]) and np.array_equal(part[5:9], x[keep][5:9])


@pytest.mark.parametrize("label_column", [-1, 1])
def test_the_split_is_the_in_memory_split(tmp_path, label_column):
    np.save(tmp_path / "d.npy", _array(label_column=label_column)[0])
    mem, mapd = (load_data(load_config(write(tmp_path / f"{m}.yaml", CONFIG % (label_column, m, "true"))))
                 for m in ("false", "true"))
    assert isinstance(mapd.x, Rows) and isinstance(mapd.x_val, Rows) and not isinstance(mem.x, Rows)
    assert np.array_equal(np.asarray(mapd.x), mem.x) and np.array_equal(np.asarray(mapd.x_val), mem.x_val)
    for a in ("y", "y_val", "samples", "samples_val"):
        assert np.array_equal(getattr(mapd, a), getattr(mem, a)), a


def _run(cli, tmp_path, memory_map, shuffle, label_column=-1):
    cfg = write(tmp_path / f"c-{memory_map}-{shuffle}.yaml", CONFIG % (label_column, memory_map, shuffle))
    runs = tmp_path / f"runs-{memory_map}-{shuffle}"
    r = cli("train", cfg, "--runs-dir", runs)
    assert r.code == 0, r.err
    run = next(runs.iterdir())
    metrics = [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(open(run / "metrics.csv"))]
    with np.load(run / "checkpoints" / "last.npz") as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
    return metrics, arrays


@pytest.mark.parametrize("shuffle", ["true", "false"])
def test_training_from_the_map_equals_training_in_memory(tmp_path, cli, shuffle, monkeypatch):
    np.save(tmp_path / "d.npy", _array(n=203, label_column=0)[0])
    read = []
    monkeypatch.setattr(pieces, "SCAN_BYTES", 16 * 4 * 8)  # the checks read 16 rows of 4 features at a time
    monkeypatch.setattr(mapped, "PIECE_BYTES", 16 * 5 * 8)  # ... and 16 labels
    original = MappedFile.rows
    monkeypatch.setattr(MappedFile, "rows", lambda self, index: read.append(len(self.array[index])) or original(self, index))
    metrics, arrays = _run(cli, tmp_path, "true", shuffle, label_column=0)
    assert read and max(read) <= 16  # a batch at a time, never the whole file
    want_metrics, want_arrays = _run(cli, tmp_path, "false", shuffle, label_column=0)
    assert metrics == want_metrics and len(metrics) == 3
    assert arrays.keys() == want_arrays.keys()
    for k in arrays:
        assert np.array_equal(arrays[k], want_arrays[k]), k


def test_a_file_larger_than_half_the_free_memory_is_mapped(tmp_path, monkeypatch):
    np.save(tmp_path / "d.npy", _array()[0])
    size = (tmp_path / "d.npy").stat().st_size
    monkeypatch.setattr(files, "host_memory_available", lambda: 3 * size)
    assert not isinstance(load_file(tmp_path / "d.npy").x, Rows)
    monkeypatch.setattr(files, "host_memory_available", lambda: size)
    assert isinstance(load_file(tmp_path / "d.npy").x, Rows)
    assert not isinstance(load_file(tmp_path / "d.npy", memory_map=False).x, Rows)


def test_memory_map_refuses_other_files_and_bad_arrays(tmp_path):
    write(tmp_path / "d.csv", "1,2,0\n")
    with pytest.raises(DataError, match=r"d.csv: memory_map reads .npy files only"):
        load_file(tmp_path / "d.csv", memory_map=True)
    np.save(tmp_path / "one.npy", np.arange(5.0))
    with pytest.raises(DataError, match=r"one.npy: expected a 2-D array .* got shape \(5,\)"):
        load_file(tmp_path / "one.npy", memory_map=True)
    np.save(tmp_path / "inf.npy", np.array([[1.0, 0], [np.inf, 1]]))
    with pytest.raises(DataError, match=r"inf.npy: sample 2: features contain inf"):
        load_file(tmp_path / "inf.npy", memory_map=True)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "inf.npy").read_bytes()[:-8])
    with pytest.raises(DataError, match=r"cut.npy: the file is cut short"):
        load_file(tmp_path / "cut.npy", memory_map=True)


def test_memory_map_with_preprocessing_says_they_do_not_go_together(tmp_path):
    np.save(tmp_path / "d.npy", _array()[0])
    text = (CONFIG % (-1, "true", "true")).replace("memory_map: true}", "memory_map: true, preprocess: {numeric: standardize}}")
    with pytest.raises(DataError, match=r"d.npy: data.preprocess transforms samples in memory, but memory_map reads"):
        load_data(load_config(write(tmp_path / "c.yaml", text)))


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(resource, "RLIMIT_DATA") or sys.platform != "linux", reason="Linux's RLIMIT_DATA")
def test_a_file_larger_than_the_memory_limit_trains_from_the_map(tmp_path):
    limit = 200 << 20  # RLIMIT_DATA: the process's own memory (a mapped file is the OS's cache, not counted)
    n, width = 600_000, 50  # 240 MB of float64
    a = np.lib.format.open_memmap(tmp_path / "big.npy", mode="w+", dtype=np.float64, shape=(n, width))
    rng = np.random.default_rng(0)
    for s in range(0, n, 100_000):
        a[s:s + 100_000, :-1] = rng.standard_normal((100_000, width - 1))
        a[s:s + 100_000, -1] = rng.integers(0, 10, 100_000)
    a.flush()
    del a
    config = ("data: {type: file, path: big.npy, memory_map: %s}\nmodel: [{type: Linear, units: 10}]\n"
              "loss: SoftmaxCrossEntropy\noptimizer: Adam\ntrain: {epochs: 1, batch_size: 4096, validation_split: 0.1}\n")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

    def train(memory_map):
        cfg = write(tmp_path / f"{memory_map}.yaml", config % memory_map)
        return subprocess.run([sys.executable, "-m", "dlrun", "train", str(cfg), "--runs-dir", str(tmp_path / "runs")],
                              capture_output=True, text=True, env=env, timeout=600,
                              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)))

    read = train("false")  # the limit bites: the array does not fit
    assert read.returncode == 2 and "not enough memory to read the file" in read.stderr, read.stderr
    assert "memory_map: true reads it a batch at a time" in read.stderr
    mapped_run = train("true")
    assert mapped_run.returncode == 0, mapped_run.stderr


def test_the_split_of_a_file_s_own_array_moves_rows_in_place(tmp_path, monkeypatch):
    from dlrun.data import take_in_place

    rng = np.random.default_rng(4)
    a = rng.standard_normal((1000, 3))
    keep = np.sort(rng.choice(1000, 700, replace=False))
    monkeypatch.setattr("dlrun.data.SCAN_BYTES", 24 * 10)  # pieces of 10 rows of 3 float64
    want = a[keep]
    got = take_in_place(a, keep)
    assert np.array_equal(got, want) and np.shares_memory(got, a)
    np.save(tmp_path / "d.npy", _array()[0])
    ds = load_data(load_config(write(tmp_path / "c.yaml", CONFIG % (-1, "false", "true"))))
    assert ds.x.base is not None  # the training rows are the file's array, moved to its front
