"""A checkpoint or run directory never runs code: the plugin files a recorded model needs run
only when the user names them with --plugin, and a plugin's sys.exit is an error, not success."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_helpers import spiral_config, train
from conftest import run_cli, write
from dlrun.runs import checkpoint

HELPER = '''\
from pathlib import Path
Path(__file__).with_name("RAN").write_text("plugin code ran")
'''

TRIPLE = '''\
from dlrun.layers import Layer
from dlrun.registry import layers


@layers.register()
class Triple(Layer):
    """y = 3x."""

    def forward(self, x):
        return 3 * x

    def backward(self, dy):
        return 3 * dy
'''


def _plant(run_dir: Path, plugins: list[str], records: list[dict] | None) -> None:
    """Rewrite the run's checkpoints so that their recorded config names ``plugins``."""
    for name in ("last.npz", "best.npz"):
        path = run_dir / "checkpoints" / name
        model, optim, meta = checkpoint.load(path)
        meta["config"]["plugins"] = plugins
        if records is None:
            meta.pop("plugins", None)
        else:
            meta["plugins"] = records
        checkpoint.save(path, model, optim, meta)


@pytest.mark.parametrize("records", [None, [], "defines"], ids=["no-records", "empty-records", "records"])
def test_a_run_directory_that_names_its_own_python_file_never_runs_it(tmp_path, records):
    run_dir = train(spiral_config(tmp_path, epochs=2), tmp_path / "runs")
    helper = write(run_dir / "checkpoints" / "helper.py", HELPER)
    relative = str(helper.relative_to(tmp_path))  # as the user's working directory sees it
    recs = ([{"path": relative, "sha256": None, "defines": ["Helper"]}] if records == "defines" else records)
    _plant(run_dir, [relative], recs)
    write(tmp_path / "x.csv", "0.1,0.2\n")
    for args in (("predict", run_dir, "--input", "x.csv"), ("evaluate", run_dir),
                 ("train", "--resume", run_dir, "--set", "train.epochs=3")):
        r = run_cli(*args, cwd=tmp_path)
        assert not (helper.parent / "RAN").exists(), (args, r.err)
        assert r.code == 2, (args, r.out, r.err)
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and f"--plugin {relative}" in lines[0] and "Traceback" not in r.err, (args, r.err)


def test_a_checkpoint_with_a_plugin_runs_when_the_user_names_it(tmp_path):
    plugin = write(tmp_path / "triple.py", TRIPLE)
    cfg = write(tmp_path / "c.yaml", "seed: 0\nplugins: [triple.py]\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Linear, units: 6}, Triple, {type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"
                                     "train: {epochs: 2, batch_size: 20}\n")
    run_dir = train(cfg, tmp_path / "runs")
    write(tmp_path / "x.csv", "0.1,0.2\n")
    r = run_cli("predict", run_dir, "--input", tmp_path / "x.csv")
    assert r.code == 2, r.err
    assert (f"the model needs plugin code from {plugin.resolve()} (defines Triple); a checkpoint never runs code by "
            f"itself: add --plugin {plugin.resolve()} to run it") in r.err, r.err
    r = run_cli("predict", run_dir, "--input", tmp_path / "x.csv", "--plugin", plugin)
    assert r.code == 0 and r.err == "" and len(r.out.splitlines()) == 2, r.err
    r = run_cli("train", "--resume", run_dir, "--set", "train.epochs=3", "--plugin", plugin)
    assert r.code == 0, r.err
    plugin.write_text(TRIPLE + "\n# edited\n")  # the recorded sha256 is checked when the file is named
    r = run_cli("evaluate", run_dir, "--plugin", plugin)
    assert r.code == 0 and "changed since" in r.err and "sha256" in r.err, r.err


def test_a_plugin_given_on_the_command_line_is_recorded_for_predict(tmp_path):
    """Trained with --plugin (the config lists no plugins:), predict says which file to name."""
    plugin = write(tmp_path / "triple.py", TRIPLE)
    cfg = write(tmp_path / "c.yaml", "seed: 0\ndata: {type: spiral, points_per_class: 20}\n"
                                     "model: [{type: Linear, units: 6}, Triple, {type: Linear, units: 3}]\n"
                                     "loss: SoftmaxCrossEntropy\noptimizer: {type: SGD, learning_rate: 0.1}\n"
                                     "train: {epochs: 1, batch_size: 20}\n")
    run_dir = train(cfg, tmp_path / "runs", "--plugin", plugin)
    meta = checkpoint.read(run_dir / "checkpoints" / "last.npz").meta
    assert [r["defines"] for r in meta["plugins"]] == [["Triple"]], json.dumps(meta["plugins"])
    r = run_cli("evaluate", run_dir)
    assert r.code == 2 and f"add --plugin {plugin.resolve()}" in r.err, r.err
