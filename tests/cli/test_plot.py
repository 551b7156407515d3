"""`dlrun plot`: the images are opened and looked at (size, colours, labels), the decision regions
and confusion matrix checked against `dlrun predict` and `dlrun evaluate`, the terminal chart
read, and every bad input answered in one line with exit 2."""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from checkpoint_helpers import spiral_config, train
from conftest import run_cli, write
from dlrun.cli.chart import line_chart
from dlrun.runs import figures, plots

image = pytest.importorskip("matplotlib.image")
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two spiral runs with a validation split and train.metrics: [f1], two learning rates."""
    tmp = tmp_path_factory.mktemp("plot")
    cfg = spiral_config(tmp, epochs=12, extra="")
    cfg.write_text(cfg.read_text().replace("validation_split: 0.25", "validation_split: 0.25, metrics: [f1]"))
    return train(cfg, tmp / "runs"), train(cfg, tmp / "runs", "--set", "optimizer.learning_rate=0.1")


def _pixels(path):
    px = image.imread(str(path))  # (height, width, RGBA) floats
    rgb = np.rint(px[..., :3] * 255).astype(int)
    return rgb, {tuple(c) for c in rgb.reshape(-1, 3)}


def _near(rgb, colour, tol=12) -> float:
    """The share of pixels within ``tol`` of ``colour`` (0-255 RGB)."""
    return float((np.abs(rgb - np.array(colour)).max(axis=-1) <= tol).mean())


def _svg_texts(path) -> tuple[ET.Element, list[str]]:
    root = ET.parse(path).getroot()
    return root, [t.text.strip() for t in root.iter(f"{SVG}text") if t.text and t.text.strip()]


def test_curves_of_two_runs_as_png_overlay_them_with_a_legend_and_the_learning_rate(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "curves.png"
    r = run_cli("plot", a, b, "--output", out, "--size", "1000x700")
    assert r.code == 0, r.err
    assert f"written to {out}" in r.err and r.out == ""
    rgb, colours = _pixels(out)
    assert rgb.shape == (700, 1000, 3)  # the size asked for, in pixels
    assert len(colours) > 50  # lines, text, antialiasing: a picture, not a blank
    assert 0.03 < (rgb.min(axis=-1) < 200).mean() < 0.5  # ink on a white page
    assert _near(rgb, (31, 119, 180)) > 0.001 and _near(rgb, (255, 127, 14)) > 0.001  # each run's colour
    # what the picture says, from the figure the command saved
    curves = [plots.read_curves(a), plots.read_curves(b)]
    fig = figures.curves_figure(curves, plots.panels(curves), (1000, 700))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_ylabel() for ax in axes] == ["loss", "accuracy", "f1", "learning rate"]
    assert {ax.get_xlabel() for ax in axes} == {"epoch"}
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend == [f"{a.name} (training)", f"{a.name} (validation)", f"{b.name} (training)", f"{b.name} (validation)"]
    lr = {line.get_label(): set(line.get_ydata()) for line in axes[3].get_lines()}
    assert lr == {a.name: {0.5}, b.name: {0.1}}  # the learning rate on a chart of its own, each run's
    loss = axes[0].get_lines()[1]  # run a's validation loss, as metrics.csv has it
    assert loss.get_linestyle() == "--"
    assert list(loss.get_ydata()) == pytest.approx([float(v) for v in _column(a, "val_loss")])


def _column(run_dir, name):
    import csv
    with open(run_dir / "metrics.csv", newline="") as f:
        return [row[name] for row in csv.DictReader(f)]


def test_curves_as_svg_carry_their_labels_as_text_at_the_size_asked(two_runs, tmp_path):
    a, _ = two_runs
    out = tmp_path / "loss.svg"
    r = run_cli("plot", a, "--metric", "loss", "--metric", "val_accuracy", "-o", out, "--size", "900x400")
    assert r.code == 0, r.err
    root, texts = _svg_texts(out)
    assert (root.get("width"), root.get("height")) == ("648pt", "288pt")  # 9 x 4 inches at 72 points an inch
    assert {"epoch", "loss", "val accuracy", "train_loss", "val_loss", "val_accuracy"} <= set(texts)
    assert "f1" not in texts and "learning rate" not in texts  # only what --metric asked for
    assert len(list(root.iter(f"{SVG}path"))) > 20


def test_decision_boundary_is_the_models_prediction_over_the_plane(two_runs, tmp_path):
    a, _ = two_runs
    out = tmp_path / "boundary.png"
    r = run_cli("plot", a, "--kind", "boundary", "-o", out, "--size", "600x560")
    assert r.code == 0, r.err
    rgb, colours = _pixels(out)
    assert rgb.shape == (560, 600, 3) and len(colours) > 50
    # each class's pale region covers a good part of the picture (3 classes of the spiral)
    for c in ((31, 119, 180), (255, 127, 14), (44, 160, 44)):
        pale = tuple(round(0.35 * v + 0.65 * 255) for v in c)
        assert _near(rgb, pale, tol=3) > 0.05, pale
    # the regions are what dlrun predict answers for the same points
    from dlrun.runs import inference
    b = plots.boundary(inference.open_model(a), a.name, resolution=40)
    pts = np.stack(np.meshgrid(b.gx, b.gy), axis=-1).reshape(-1, 2)
    np.savetxt(tmp_path / "grid.csv", pts, delimiter=",", fmt="%.17g")
    r = run_cli("predict", a, "--input", tmp_path / "grid.csv")
    assert r.code == 0, r.err
    predicted = np.array([int(v) for v in r.out.split()[1:]])
    assert np.array_equal(b.regions.ravel(), predicted)
    assert len(np.unique(predicted)) == 3
    assert len(b.x) == 120 and b.validation.sum() == 30  # training and validation samples, told apart
    fig = figures.boundary_figure([b], (600, 560))
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("feature 0", "feature 1") and a.name in ax.get_title()


def test_confusion_matrix_is_dlrun_evaluates(two_runs, tmp_path):
    a, b = two_runs
    out = tmp_path / "cm.svg"
    r = run_cli("plot", a, b, "--kind", "confusion", "-o", out)
    assert r.code == 0, r.err
    evaluated = json.loads(run_cli("evaluate", a, "--json").out)["confusion"]
    root, texts = _svg_texts(out)
    assert root.get("width").endswith("pt") and {"predicted class", "true class"} <= set(texts)
    counts = [t for t in texts if t.isdigit()]
    assert [str(v) for row in evaluated for v in row] == counts[6:15]  # after a's ticks 0 1 2 / 0 1 2
    from dlrun.runs import inference
    m = plots.confusion(inference.open_model(a), a.name)
    assert m.matrix.tolist() == evaluated
    # without --output: the same matrix as a table
    r = run_cli("plot", a, "--kind", "confusion")
    assert r.code == 0 and "confusion matrix (rows true, columns predicted)" in r.out
    assert "accuracy" in r.out and str(evaluated[0][0]) in r.out


def test_without_matplotlib_the_curves_are_drawn_in_the_terminal(two_runs, tmp_path, monkeypatch):
    a, b = two_runs
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # (as when it is not installed)
    r = run_cli("plot", a, b, "--metric", "loss", process=False)
    assert r.code == 0, r.err
    assert "loss" in r.out.splitlines()[0] and "epoch" in r.out
    assert f"{a.name} train_loss" in r.out and f"{b.name} val_loss" in r.out
    assert sum(0x2800 < ord(ch) <= 0x28FF for ch in r.out) > 60  # the braille curves
    assert r.err.strip() == ("note: for PNG or SVG images, install matplotlib (pip install 'dlrun[plot]') and add "
                             "--output FILE.png")
    r = run_cli("plot", a, "-o", tmp_path / "x.png", process=False)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "images need matplotlib, which is not installed: pip install 'dlrun[plot]'" in r.err
    assert not (tmp_path / "x.png").exists()


def test_without_output_the_decision_regions_are_drawn_as_a_map_in_the_terminal(two_runs, monkeypatch):
    a, _ = two_runs
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    r = run_cli("plot", a, "--kind", "boundary", process=False)
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].startswith(f"{a.name}: accuracy ")
    rows = [line.split("┤" if "┤" in line else "│", 1)[1] for line in lines[1:] if "┤" in line or "│" in line]
    assert len({len(row) for row in rows}) == 1 and len(rows) >= 10  # a rectangle of cells
    cells = "".join(rows)
    assert set(cells) <= set("012●x") and {"0", "1", "2"} <= set(cells)  # every class has a region
    samples = cells.count("●") + cells.count("x")
    assert 40 < samples <= 120  # the 120 samples (several may share a cell)
    from dlrun.runs import inference
    b = plots.boundary(inference.open_model(a), a.name, resolution=(len(rows[0]), len(rows)))
    top = rows[0]  # the regions, top row first: where no sample covers a cell, its class's digit
    assert all(ch == str(b.regions[-1, j]) for j, ch in enumerate(top) if ch.isdigit())
    assert "note: for PNG or SVG images" in r.err


def test_terminal_chart_draws_the_line_where_it_goes():
    x = np.arange(1.0, 11.0)
    lines = line_chart([("up", x, x, "blue", False)], width=10, height=5, title="t").plain.splitlines()
    rows = lines[1:6]  # under the title: the y labels, an axis, then 10 characters of chart
    assert rows[0].split()[0] == "10" and rows[-1].split()[0] == "1"  # the top is the largest value
    chart = [r[r.index("┤" if "┤" in r else "│") + 1:] for r in rows]
    assert all(len(c) == 10 for c in chart)
    assert chart[0][-1] != " " and chart[-1][0] != " "  # top right and bottom left are inked
    assert chart[0][0] == " " and chart[-1][-1] == " "  # top left and bottom right are not
    def dots(lines):
        return sum(bin(ord(c) - 0x2800).count("1") for r in lines[1:6] for c in r if 0x2800 <= ord(c) <= 0x28FF)

    dashed = line_chart([("up", x, x, "blue", True)], 10, 5, "t").plain.splitlines()
    assert 0.3 * dots(lines) < dots(dashed) < 0.75 * dots(lines)  # a dashed line: about half the dots
    assert "⠒⠒⠒ up" in "\n".join(lines[6:])  # the legend


def _sine_run(tmp_path):
    cfg = write(tmp_path / "sine.yaml", "seed: 1\ndata: {type: sine, samples: 64}\nmodel: [{type: Linear, units: 4}, "
                                        "Tanh, {type: Linear, units: 1}]\nloss: MSE\noptimizer: {type: SGD, "
                                        "learning_rate: 0.1}\ntrain: {epochs: 2, batch_size: 32}\n")
    return train(cfg, tmp_path / "runs")


def _iris_run(tmp_path):
    cfg = write(tmp_path / "iris.yaml", "seed: 1\ndata: iris\nmodel: [{type: Linear, units: 3}]\n"
                                        "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"
                                        "train: {epochs: 2, batch_size: 50}\n")
    return train(cfg, tmp_path / "runs")


@pytest.mark.parametrize("case", ["no-metrics", "not-a-dir", "metric", "iris-boundary", "sine-boundary",
                                  "sine-confusion", "unwritable", "suffix", "size"])
def test_bad_input_is_one_line_and_exit_2(two_runs, tmp_path, case):
    a, _ = two_runs
    out = tmp_path / "x.png"
    args, expect = {
        "no-metrics": ((tmp_path,), f"{tmp_path}: no metrics.csv (expected a run directory written by dlrun train)"),
        "not-a-dir": ((tmp_path / "nope",), "not a run directory"),
        "metric": ((a, "--metric", "los"), "--metric los: not recorded by this run (did you mean loss?); recorded: "
                                           "loss, accuracy, f1, learning_rate"),
        "iris-boundary": (None, "a decision boundary is drawn for a model of 2 input features; this one takes "
                                "samples of shape (4,)"),
        "sine-boundary": (None, "a decision boundary needs a classification model; this one is trained with MSE"),
        "sine-confusion": (None, "a confusion matrix needs a classification model"),
        "unwritable": ((a, "-o", tmp_path / "missing" / "x.png"), "cannot write the file (No such file or directory); "
                                                                  "nothing was written"),
        "suffix": ((a, "-o", tmp_path / "x.jpg"), "expected a file name ending in .png or .svg, got '.jpg'"),
        "size": ((a, "-o", out, "--size", "12x9000000"), "--size 12x9000000: expected WIDTHxHEIGHT in pixels"),
    }[case]
    if case == "iris-boundary":
        args = (_iris_run(tmp_path), "--kind", "boundary", "-o", out)
    elif case.startswith("sine"):
        args = (_sine_run(tmp_path), "--kind", case.split("-")[1], "-o", out)
    r = run_cli("plot", *args)
    assert r.code == 2, (r.code, r.err)
    assert len(r.err.strip().splitlines()) == 1 and expect in r.err and "Traceback" not in r.err, r.err
    assert not out.exists() and not list(tmp_path.glob(".x.png.tmp-*"))


def test_ctrl_c_while_the_image_is_written_leaves_no_file(two_runs, tmp_path, monkeypatch):
    import os
    import signal
    from matplotlib.figure import Figure
    a, _ = two_runs
    out = tmp_path / "curves.png"
    out.write_bytes(b"an earlier picture")
    real = Figure.savefig

    def interrupted(self, fname, **kw):
        real(self, fname, **kw)  # the temporary file is written, then the signal comes
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(Figure, "savefig", interrupted)
    r = run_cli("plot", a, "-o", out, process=False)
    assert r.code == 130 and r.err.strip() == "interrupted", r.err
    assert out.read_bytes() == b"an earlier picture"  # the file there is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]  # and no temporary file is left
