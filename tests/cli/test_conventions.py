"""Command-line conventions: --version, -h, shell completion, flags shown as flags, and
`dlrun check NAME` running gradcheck's check of a registered component."""
from __future__ import annotations

import json
import re

import pytest

import typer

from conftest import CONFIGS, write
from dlrun import __version__
from dlrun.cli import app

COMMANDS = tuple(typer.main.get_command(app).commands)  # every command, those added later too


def test_version(cli):
    r = cli("--version")
    assert r.code == 0 and r.out.strip() == f"dlrun {__version__}"


@pytest.mark.parametrize("command", ("",) + COMMANDS)
def test_h_is_help_and_flags_show_as_flags(cli, command):
    args = [command] if command else []
    short, long = cli(*args, "-h"), cli(*args, "--help")
    assert short.code == long.code == 0 and short.out == long.out and "Usage: dlrun" in short.out
    assert "<bool>" not in short.out and "-h, --help" in short.out


def test_a_boolean_option_is_a_flag(cli, tmp_path):
    assert re.search(r"^  --proba +Add one probability column", cli("predict", "-h").out, re.M)
    assert re.search(r"^  -q, --quiet +Print only the run directory", cli("train", "-h").out, re.M)
    r = cli("predict", tmp_path, "--input", "x.csv", "--proba", "true")
    assert r.code == 2 and "true" in r.err  # a flag takes no value


def test_shell_completion(cli):
    assert "--install-completion" in cli("--help").out and "--show-completion" in cli("--help").out
    r = cli("--show-completion", "bash")
    assert r.code == 0 and "_DLRUN_COMPLETE=complete_bash" in r.out and "complete -o default -F" in r.out


def test_completion_answers_the_shell(cli):
    """What bash's completion function asks a real process: the command names, then options."""
    r = cli(env={"_DLRUN_COMPLETE": "complete_bash", "COMP_WORDS": "dlrun tr", "COMP_CWORD": "1"}, process=True)
    assert r.code == 0 and r.out.split() == ["train"]
    r = cli(env={"_DLRUN_COMPLETE": "complete_bash", "COMP_WORDS": "dlrun train --qu", "COMP_CWORD": "2"},
            process=True)
    assert r.out.split() == ["--quiet"]


BROKEN = '''
from dlrun.api import InputSpec, Layer, layers


@layers.register()
class HalfSquare(Layer):
    """z = x² (backward forgets the factor 2)."""

    input_spec = InputSpec(shape=("D",))

    def forward(self, x):
        self._x = x
        return x ** 2

    def backward(self, dy):
        return dy * self._x
'''


def _without_time(text: str) -> str:
    return re.sub(r"\d+\.\d+s\b", "", text)


@pytest.mark.parametrize("args", [("LargeMarginFC",), ("Hinge", "--dtype", "float32"), ("L1", "--seed", "3"),
                                  ("Linear", "--set", "units=3", "--mode", "fast")])
def test_check_name_is_gradcheck(cli, args):
    check, gradcheck = cli("check", *args), cli("gradcheck", *args)
    assert check.code == gradcheck.code == 0, check.out + check.err
    assert _without_time(check.out) == _without_time(gradcheck.out) and check.err == gradcheck.err
    assert "RESULT " in check.out and ": PASS" in check.out


def test_check_name_fails_as_gradcheck_does_with_a_plugin(cli, tmp_path):
    plugin = write(tmp_path / "broken.py", BROKEN)
    check = cli("check", "HalfSquare", "--plugin", plugin, "--json")
    gradcheck = cli("gradcheck", "HalfSquare", "--plugin", plugin, "--json")
    assert check.code == gradcheck.code == 1
    a, b = json.loads(check.out), json.loads(gradcheck.out)
    a.pop("seconds"), b.pop("seconds")
    assert a == b and a["result"] == "FAIL"


def test_check_of_a_component_without_backward_or_of_a_typo(cli):
    r = cli("check", "Adam")
    assert r.code == 2 and "optimizer" in r.err and "no backward pass" in r.err
    r = cli("check", "LargeMarginFc")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "neither a file nor a registered layer, loss or regularizer" in r.err and "did you mean LargeMarginFC" in r.err


def test_check_config_keeps_its_dry_run(cli, tmp_path):
    r = cli("check", CONFIGS / "spiral.yaml")
    assert r.code == 0 and "one batch forward" in r.out and "nothing written" in r.out
    r = cli("check", CONFIGS / "spiral.yaml", "--eps", "1e-3")
    assert r.code == 2 and "--eps" in r.err and "gradcheck" in r.err
    r = cli("check", "missing.yaml")
    assert r.code == 2 and "not found" in r.err
    r = cli("check", "LargeMarginFC", "--checkpoint", tmp_path)
    assert r.code == 2 and "--checkpoint" in r.err


def test_both_help_texts_say_what_check_does_with_a_name(cli):
    check = " ".join(cli("check", "-h").out.split())
    assert "Dry-run a CONFIG.yaml" in check and "gradient-check it as `dlrun gradcheck NAME` does" in check
    gradcheck = " ".join(cli("gradcheck", "-h").out.split())
    assert "`dlrun check NAME` runs the same check" in gradcheck
