"""The BLAS thread count dlrun sets: --threads, DLRUN_THREADS, the BLAS library's own variable,
the default; recorded in summary.json; the process's pools left as they were."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from conftest import CONFIGS
from dlrun.backend import threads


def _blas() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def _summary(r, runs: Path) -> dict:
    assert r.code == 0, r.err
    return json.loads((runs / r.out.strip().splitlines()[-1].split("/")[-1] / "summary.json").read_text())


def test_limit_sets_and_restore_puts_back():
    before = _blas()
    try:
        assert threads.limit(3) == 3 and set(_blas()) == {3} and threads.current() == 3
        assert threads.limit(1) == 1 and set(_blas()) == {1}
    finally:
        threads.restore()
    assert _blas() == before


def test_the_default_unless_the_environment_names_a_count(monkeypatch):
    for name in threads.BLAS_ENV:
        monkeypatch.delenv(name, raising=False)
    assert threads.chosen(None) == threads.DEFAULT and threads.chosen(4) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.chosen(None) is None and threads.chosen(3) == 3  # the BLAS variable is left in charge


@pytest.mark.parametrize("where", ["after", "before"])
def test_threads_option_is_recorded_in_summary(cli, tmp_path, where):
    args = ["train", CONFIGS / "spiral.yaml", "--runs-dir", tmp_path, "--set", "train.epochs=2", "--quiet"]
    before = _blas()
    r = cli(*(args + ["--threads", "3"] if where == "after" else ["--threads", "3"] + args))
    assert _summary(r, tmp_path)["threads"] == 3
    assert _blas() == before  # (the command ran in this process and put the pools back)


def test_environment_variable_and_default(cli, tmp_path):
    args = ["train", CONFIGS / "spiral.yaml", "--runs-dir", tmp_path, "--set", "train.epochs=2", "--quiet"]
    assert _summary(cli(*args, env={"DLRUN_THREADS": "2"}), tmp_path)["threads"] == 2
    env = {k: "" for k in threads.BLAS_ENV}  # (pytest-xdist's workers set OPENBLAS_NUM_THREADS)
    assert _summary(cli(*args, env=env, process=True), tmp_path)["threads"] == threads.DEFAULT
    r = cli(*args, env={"DLRUN_THREADS": "many"})
    assert r.code == 2 and "DLRUN_THREADS" in r.err and "'many'" in r.err and len(r.err.strip().splitlines()) == 2
    r = cli(*args, "--threads", "0")
    assert r.code == 2 and "--threads" in r.err


def test_a_blas_variable_of_the_user_is_left_in_charge(cli, tmp_path):
    env = {k: "" for k in threads.BLAS_ENV}
    env["OPENBLAS_NUM_THREADS"] = "2"
    r = cli("train", CONFIGS / "spiral.yaml", "--runs-dir", tmp_path, "--set", "train.epochs=2", "--quiet", env=env,
            process=True)
    assert _summary(r, tmp_path)["threads"] == 2
