"""`dlrun list` and `dlrun show`: what the registries hold."""
from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .. import registry
from ..config.source import dump_yaml
from ..errors import UsageError
from ..registry.options import did_you_mean
from ..registry.plugins import load_plugins
from . import app, out

PLUGIN_HELP = "Python file with user components to load first (repeatable)."
PLUGIN = typer.Option([], "--plugin", help=PLUGIN_HELP, metavar="FILE.py")  # shared by every command


@app.command("list")
def list_cmd(
    kind: Optional[str] = typer.Argument(None, help="layers, initializers, losses, regularizers, optimizers, data, schedules or metrics."),
    plugin: list[str] = PLUGIN,
) -> None:
    """List registered components with their one-line summaries."""
    load_plugins(plugin)
    kinds = registry.REGISTRIES
    if kind is not None and kind not in kinds:
        raise UsageError(f"unknown kind {kind!r}{did_you_mean(kind, kinds)}; valid kinds: {', '.join(kinds)}")
    for k in [kind] if kind else kinds:
        reg = kinds[k]
        t = Table(title=k, title_justify="left")
        t.add_column("name", style="bold")
        t.add_column("summary")
        for name in reg.names():
            origin = reg.origin(name)
            t.add_row(name, escape(reg.summary(name)) + ("" if origin == "builtin" else f"  [dim](from {origin})[/]"))
        out.print(t)


@app.command("show")
def show_cmd(
    name: str = typer.Argument(..., help="Component name, e.g. Linear or he_normal."),
    plugin: list[str] = PLUGIN,
) -> None:
    """Show a component's documentation and options (types, defaults, docs)."""
    load_plugins(plugin)
    reg, _ = registry.find(name)
    body = reg.description(name)
    out.print(f"[bold]{name}[/] ({reg.kind}, {reg.origin(name)})")
    if body:
        out.print(body, markup=False)
    opts = reg.options(name)
    if not opts:
        out.print("options: none")
        return
    t = Table(title="options", title_justify="left")
    for c in ("option", "type", "default", "description"):
        t.add_column(c, no_wrap=c == "option")  # the names are the config keys: never cut
    for o in opts:
        default = "(required)" if o.required else dump_yaml(o.default).removesuffix("\n...\n").strip()
        t.add_row(o.name, escape(o.type_name), escape(default), escape(o.doc))
    out.print(t)
