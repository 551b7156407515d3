"""`dlrun train` in a real pseudo-terminal of 80 and 160 columns: the bytes it writes are played
on a terminal emulator (pyte) and the screen is read back, as a user would see it; and the same
command from a pipe, which must stay plain log lines."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios

import pyte
import pytest

from conftest import CONFIGS, ROOT, run_process

LIVE = re.compile(r"^epoch +\d+/\d+ ━")  # the status line (the model table's borders have ━ too)
EPOCH = re.compile(r"^epoch +(\d+)/(\d+)  \S")


def on_terminal(args: list[str], columns: int, rows: int = 40, timeout: float = 300.0):
    """Run ``dlrun ARGS`` on a pseudo-terminal ``columns`` wide; return (exit code, every line
    the screen showed in order (scrolled-off history, then the final screen), and the status
    lines seen while it ran)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "TERM")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    pid, fd = pty.fork()
    if pid == 0:  # (the child: the CLI on the terminal)
        try:
            os.chdir(ROOT)
            os.execvpe(sys.executable, [sys.executable, "-m", "dlrun", *args], env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    screen = pyte.HistoryScreen(columns, rows, history=100000)
    stream = pyte.ByteStream(screen)
    live: list[str] = []
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError(f"dlrun {' '.join(args)} wrote nothing for {timeout}s")
            try:
                data = os.read(fd, 65536)
            except OSError:  # (the child closed the terminal)
                break
            if not data:
                break
            # (fed a piece at a time: a slow reader gets several redraws in one read, and the
            # status line shows between them, on the cursor's row, before a carriage return)
            for piece in re.split(rb"(?=\r)", data):
                stream.feed(piece)
                row = screen.buffer[screen.cursor.y]
                line = "".join(row[x].data for x in range(columns)).rstrip()
                if LIVE.match(line):
                    live.append(line)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    history = ["".join(line[x].data for x in range(columns)).rstrip() for line in screen.history.top]
    shown = history + [ln.rstrip() for ln in screen.display]
    return os.waitstatus_to_exitcode(status), shown, live


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 160])
def test_live_display_fits_the_terminal(tmp_path, columns):
    """Four metrics each for training and validation data (digits_cnn with train.metrics and
    val_accuracy monitored): each epoch leaves its line; the status line fits the width and
    always has the counter, a bar and the monitored metric labelled with its epoch."""
    code, shown, live = on_terminal(
        ["train", str(CONFIGS / "digits_cnn.yaml"), "--runs-dir", str(tmp_path), "--set", "train.epochs=4",
         "--set", "train.metrics=[f1, {type: top_k_accuracy, k: 2}]", "--set", "train.monitor=val_accuracy"],
        columns)
    assert code == 0, "\n".join(shown)
    assert all(len(ln) <= columns for ln in shown)
    starts = [EPOCH.match(ln) for ln in shown]
    assert [int(m[1]) for m in starts if m] == [1, 2, 3, 4]  # one line per epoch, in order, none repeated
    epoch_lines = "\n".join(shown)
    for k in ("loss", "acc", "f1", "top_k_accuracy", "val_loss", "val_acc", "val_f1", "val_top_k_accuracy"):
        assert re.search(rf"(^| ){k} \d\.\d{{4}}", epoch_lines, re.M), k  # every metric, wrapped if need be
    assert not any(LIVE.match(ln) for ln in shown)  # the status line is taken down at the end
    labelled = [ln for ln in live if "│ epoch " in ln]
    assert live and labelled, "no status line was seen while training"
    for ln in labelled:
        now, done = int(ln.split()[1].split("/")[0]), int(ln.split("│ epoch ")[1].split(":")[0])
        assert done in (now, now - 1)  # the metrics shown belong to the last finished epoch, and say so
        assert re.search(r"│ epoch \d+: val_acc \d\.\d{4}", ln)  # the monitored one first
        assert re.search(r"━{10,}", ln) and " ETA " in ln and re.search(r"\d+s ETA", ln)
        if columns == 80:
            assert ln.endswith("…"), ln  # the other metrics are cut first
        else:
            assert all(f" {k} " in ln for k in ("loss", "acc", "f1", "top_k_accuracy", "val_loss")), ln
    closing = shown[shown.index(next(ln for ln in shown if ln.startswith("4 epochs in "))):]
    assert closing[1].startswith("kept epoch ") and "(best val_accuracy)" in closing[1]
    assert (tmp_path / closing[-1].split("/")[-1]).is_dir() or closing[-1].startswith(str(tmp_path))


@pytest.mark.slow
def test_events_and_the_kept_epoch_on_a_terminal(tmp_path):
    """moons_dropout stops early and restores its best weights: each said in one line after the
    epoch's line, and the closing lines name the epoch kept with its metrics."""
    code, shown, _ = on_terminal(["train", str(CONFIGS / "moons_dropout.yaml"), "--runs-dir", str(tmp_path)], 80)
    assert code == 0, "\n".join(shown)
    i = next(k for k, ln in enumerate(shown) if "early stopping" in ln)
    last = EPOCH.match(shown[i - 1])
    assert last and shown[i] == f"epoch {last[1]}: early stopping (val_loss: no improvement in 20 epochs)"
    best = int(last[1]) - 20
    assert re.fullmatch(rf"restored the weights of epoch {best}, the best val_loss \(\d\.\d{{4}}\)", shown[i + 1])
    assert re.fullmatch(rf"{last[1]} epochs in \d+\.\d\ds, stopped early", shown[i + 2])
    assert shown[i + 3].startswith(f"kept epoch {best}/{last[1]} (best val_loss)  loss ")


def test_from_a_pipe_the_output_is_plain_log_lines(tmp_path):
    r = run_process("train", CONFIGS / "moons_dropout.yaml", "--runs-dir", tmp_path, "--set", "train.epochs=30",
                    "--set", "train.early_stopping.patience=3", "--set", "model[2].rate=0.0")
    assert r.code == 0, r.err
    assert "\x1b" not in r.out + r.err and "\r" not in r.out
    lines = r.out.splitlines()
    body = lines[lines.index(next(ln for ln in lines if ln.startswith("epoch "))):]
    known = (EPOCH, re.compile(r"^epoch \d+: early stopping \("), re.compile(r"^restored the weights of epoch \d+"),
             re.compile(r"^\d+ epochs in "), re.compile(r"^kept epoch \d+/\d+ \(best val_loss\)  loss \S+ acc"),
             re.compile(re.escape(str(tmp_path))))
    assert all(any(p.search(ln) for p in known) for ln in body), body


def test_quiet_prints_the_run_directory_alone(tmp_path, cli):
    r = cli("train", CONFIGS / "moons_dropout.yaml", "--runs-dir", tmp_path, "--quiet")
    assert r.code == 0 and r.err == ""
    assert r.out.splitlines() == [r.out.strip()] and (tmp_path / r.out.strip().split("/")[-1]).is_dir()
    assert cli("train", CONFIGS / "moons_dropout.yaml", "--quiet", "--verbose").code == 2


def test_verbose_adds_set_up_learning_rate_and_the_last_epoch(tmp_path, cli):
    r = cli("train", CONFIGS / "moons_dropout.yaml", "--runs-dir", tmp_path, "-v", "--threads", "1")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert any(ln.startswith("training epochs 1 to 100: 13 batches of 32 per epoch on cpu, float32, 1 BLAS thread; "
                             "watching val_loss (lower is better)") for ln in lines)
    assert all(" lr 0.0" in ln for ln in lines if EPOCH.match(ln))
    kept = next(ln for ln in lines if ln.startswith("kept epoch "))
    last = next(ln for ln in lines if ln.startswith("last epoch "))
    assert kept.split()[2].split("/")[1] == last.split()[2].split("/")[0]  # (kept 27/47, last 47/47)


@pytest.mark.slow
def test_a_warning_during_training_gets_a_line_of_its_own(tmp_path):
    """The first-loss warning comes after the first step, while the status line is up: it is
    printed on a line of its own, with the status line taken down and put back."""
    text = (CONFIGS / "loans.yaml").read_text().replace("path: data/loans.csv", f"path: {CONFIGS / 'data/loans.csv'}")
    cfg = tmp_path / "loans_raw.yaml"
    cfg.write_text(text.replace("numeric: standardize", "numeric: none").replace("epochs: 30", "epochs: 3"))
    code, shown, _ = on_terminal(["train", str(cfg), "--runs-dir", str(tmp_path / "runs")], 80)
    assert code == 0, "\n".join(shown)
    chance = [ln for ln in shown if "times chance level" in ln or "chance level" in ln]
    starts = [k for k, ln in enumerate(shown) if ln.startswith("warning: ") and "first" in ln and "loss" in ln]
    assert starts, "\n".join(shown)
    assert not any(LIVE.match(ln) or "━━" in ln and "warning" in ln for ln in shown), "\n".join(shown)
    assert [int(m[1]) for m in map(EPOCH.match, shown) if m] == [1, 2, 3] and chance
