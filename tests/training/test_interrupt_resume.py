"""Ctrl-C / SIGTERM keeps the state after the last finished batch, and --resume continues that
epoch from the next batch: interrupted and resumed (once or twice) equals uninterrupted, bit for
bit, with shuffling, a stochastic layer, momentum, clipping and a per-step schedule."""
from __future__ import annotations

import numpy as np
import pytest

from checkpoint_helpers import metrics_rows, summary
from conftest import run_cli, write
from dlrun.runs import checkpoint, run
from resume_helpers import (NOISE, NOISY, PER_STEP, InterruptAt, _assert_same_state, _config_and_straight_run,
                            _forget_noise_plugin, _interrupted, _resume_equals)  # noqa: F401  (an autouse fixture)


@pytest.mark.slow
@pytest.mark.parametrize("text", [NOISY, PER_STEP], ids=["plain", "per-step-schedule"])
def test_interrupt_mid_epoch_keeps_the_batches_done_and_resumes_exactly(tmp_path, text):
    assert text.count("EPOCHS") == 1
    cfg, straight = _config_and_straight_run(tmp_path, text.replace("EPOCHS", "6"))
    resumed, (meta,) = _interrupted(cfg, tmp_path / "b", InterruptAt(4, 2))
    assert meta["epoch"] == 3 and meta["interrupted"]["batches_done"] == 2
    position = meta["position"]
    assert (position["epoch"], position["batches_done"], position["batch_size"]) == (4, 2, 16)
    assert meta["step"] == 3 * position["batches"] + 2  # the two batches are not trained again
    assert len(metrics_rows(resumed)) == 3
    _resume_equals(straight, resumed)
    assert summary(resumed)["resumed_from_epoch"] == 3 and summary(resumed)["resumed_from_batch"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [16, "null"], ids=["last-batch", "full-batch"])
def test_interrupt_in_an_epochs_last_batch_keeps_that_epoch(tmp_path, batch_size):
    """A signal during an epoch's last batch stops at the epoch's end. The checkpoint said epoch 4
    but held epoch 3's weights (the finished epoch was undone), so the resumed run skipped an epoch;
    with full-batch training (configs/spiral.yaml) that was every Ctrl-C."""
    cfg, straight = _config_and_straight_run(
        tmp_path, NOISY.replace("EPOCHS", "6").replace("batch_size: 16", f"batch_size: {batch_size}"))
    resumed, (meta,) = _interrupted(cfg, tmp_path / "b", InterruptAt(4, -1))
    assert meta["epoch"] == 4 and meta.get("position") is None and len(metrics_rows(resumed)) == 4
    _resume_equals(straight, resumed)


@pytest.mark.slow
def test_interrupted_twice_in_one_epoch_and_once_more_resumes_exactly(tmp_path):
    cfg, straight = _config_and_straight_run(tmp_path, PER_STEP.replace("EPOCHS", "6"))
    resumed, metas = _interrupted(cfg, tmp_path / "b", InterruptAt(3, 1), InterruptAt(3, 3), InterruptAt(5, 2))
    assert [m["position"]["batches_done"] for m in metas] == [1, 3, 2]
    assert [m["position"]["epoch"] for m in metas] == [3, 3, 5]
    _resume_equals(straight, resumed)


def _spoil(trainer):
    trainer.model.layers[0].params["weight"].data[0, 0] = np.nan


@pytest.mark.slow
def test_a_non_finite_state_at_an_interrupt_is_not_kept(tmp_path):
    """The state after the last batch is saved only when it is finite; otherwise the epoch is
    undone and the checkpoint holds the state it started from."""
    cfg, straight = _config_and_straight_run(tmp_path, NOISY.replace("EPOCHS", "6"))
    resumed, (meta,) = _interrupted(cfg, tmp_path / "b", InterruptAt(4, 2, before=_spoil))
    assert meta["epoch"] == 3 and meta.get("position") is None
    _resume_equals(straight, resumed)


@pytest.mark.slow
def test_resuming_inside_an_epoch_with_other_batches_is_refused_and_a_failure_keeps_the_position(tmp_path):
    plugin = write(tmp_path / "noise_plugin.py", NOISE)
    cfg = write(tmp_path / "cfg.yaml", NOISY.replace("EPOCHS", "6"))
    resumed, (meta,) = _interrupted(cfg, tmp_path / "b", InterruptAt(2, 3))
    saved = (resumed / "checkpoints" / "last.npz").read_bytes()
    rows = (resumed / "metrics.csv").read_text()
    r = run_cli("train", "--resume", resumed, "--set", "train.batch_size=8", "--plugin", plugin)
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert ("the run stopped after batch 3 of 5 of epoch 2 (72 training samples in 5 batches of 16, shuffled); "
            "the resumed config gives 72 training samples in 9 batches of 8, shuffled") in r.err
    assert "first finish epoch 2 with them (--set train.epochs=2), then resume with the new ones" in r.err
    assert (resumed / "metrics.csv").read_text() == rows  # nothing written
    # the same sizes from other data (another data seed) is refused too; it was not checked
    r = run_cli("train", "--resume", resumed, "--set", "data.seed=9", "--plugin", plugin)
    assert r.code == 2 and ("the run stopped after batch 3 of 5 of epoch 2, but the resumed config gives other "
                            "training data (same size, other values)") in r.err, r.err
    assert (resumed / "metrics.csv").read_text() == rows
    assert "data_digest" in meta
    # a run resumed inside an epoch that then diverges keeps the state it was resumed from
    r = run_cli("train", "--resume", resumed, "--set", "optimizer.learning_rate=1e30", "--plugin", plugin)
    assert r.code == 1 and "the last good checkpoint (batch 3 of 5 of epoch 2) is" in r.err, r.err
    after = checkpoint.read(resumed / "checkpoints" / "last.npz")
    assert after.meta["position"] == meta["position"] and after.meta["step"] == meta["step"]
    (tmp_path / "saved.npz").write_bytes(saved)
    before = checkpoint.read(tmp_path / "saved.npz")
    assert all(np.array_equal(before.model[k], after.model[k]) for k in before.model)
    # the way out the refusal gives: finish the epoch as it started, then change the batch size
    # (the diverged resume above left the checkpoint as it was, its config included, and config.yaml
    # with it: a resume then warned that config.yaml had been edited by hand)
    ckpt = checkpoint.read(resumed / "checkpoints" / "last.npz")
    assert ckpt.meta["config"]["optimizer"]["learning_rate"] == 0.3 and not run.config_edited(resumed, ckpt)
    r = run_cli("train", "--resume", resumed, "--set", "train.epochs=2", "--plugin", plugin)
    assert r.code == 0 and "edited by hand" not in r.err, r.err
    r = run_cli("train", "--resume", resumed, "--set", "train.batch_size=8", "--set", "train.epochs=3", "--plugin", plugin)
    assert r.code == 0, r.err
