"""`dlrun config` (a config with every default applied) and `dlrun schema` (the JSON Schema of configs)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..config import load_config
from ..config.resolved import BLOCK, resolved
from ..config.schema import json_schema
from ..config.source import dump_yaml
from ..errors import UsageError
from ..registry.plugins import load_plugins
from . import app, out
from .catalog import PLUGIN
from .train import SET_HELP


@app.command("config")
def config_cmd(
    config: Path = typer.Argument(..., help="YAML config file."),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (overrides the config)."),
    device: Optional[str] = typer.Option(None, "--device", metavar="cpu|gpu", help="cpu or gpu (overrides the config)."),
    plugin: list[str] = PLUGIN,
) -> None:
    """Print the config with every default applied: the YAML dlrun train runs (a run keeps it as config.resolved.yaml).

    Every top-level key, every train: setting and every option of every component, written out.
    dlrun train accepts the output and trains exactly as from CONFIG.
    A config without a seed prints seed: null (a seed is drawn when the run starts, and recorded).
    """
    load_plugins(plugin)
    cfg = load_config(config, set_, seed=seed, device=device)
    out.print(dump_yaml(resolved(cfg), BLOCK), markup=False, highlight=False, end="")


@app.command("schema")
def schema_cmd(
    plugin: list[str] = PLUGIN,
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE",
                                          help="Write the schema to FILE instead of printing it."),
) -> None:
    """Print the JSON Schema of dlrun configs, for editors: completion, docs and errors while typing.

    Generated from the registered components' typed options (types, defaults, docs).
    Plugins' components are included when named with --plugin. docs/config.md shows the editor set-up.
    """
    load_plugins(plugin)
    text = json.dumps(json_schema(), indent=2) + "\n"
    if output is None:
        out.print(text, markup=False, highlight=False, end="")
        return
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(output)
    except OSError as e:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise UsageError(f"--output {output}: cannot write it: {e.strerror or e}") from None
    out.print(str(output), markup=False, highlight=False)
