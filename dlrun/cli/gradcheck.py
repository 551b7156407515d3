"""`dlrun gradcheck`: check a layer's (or a whole config's) backward against finite differences."""
from __future__ import annotations

import inspect
import json
import re
import typing
from contextlib import nullcontext
from dataclasses import fields
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from ..config.source import Source, apply_override
from ..errors import UsageError
from .. import registry
from ..registry.options import did_you_mean
from ..gradcheck import ERROR, PASS, Settings, check_all, check_config, check_layer, check_loss, check_regularizer
from ..gradcheck.settings import MODES, PHASES
from ..gradcheck.report import NA, band
from ..registry.plugins import load_plugins
from . import app, err, out
from .catalog import PLUGIN

EXIT = {PASS: 0, "FAIL": 1, ERROR: 2}
CHECKED = (registry.layers, registry.losses, registry.regularizers)  # the kinds with a backward pass
STYLE = {PASS: "green", "FAIL": "bold red", ERROR: "bold yellow", "n/a": "dim"}


def _fmt(v: float) -> str:
    return f"{v:.1e}"


def _status(s: str) -> str:
    return f"[{STYLE.get(s, '')}]{s}[/]"


def tensor_table(report) -> Table:
    """One row per tensor, narrow enough for 80 columns: the role is in --json, and each tensor's
    band and worst element go on a line below the table (see tensor_line)."""
    t = Table(title=escape(f"gradcheck {title(report)}"), title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, padding=(0, 1), collapse_padding=True)
    # shapes wrap between configurations, never inside one (a squeezed column would print one
    # character per line)
    widest = max((len(s) for r in report.tensors for s in r.shape_text.split()), default=5)
    for c, j in (("tensor", "left"), ("shape", "left"), ("mode", "left"), ("checked", "right"),
                 ("skipped", "right"), ("max abs", "right"), ("max rel", "right"), ("sym rel", "right"),
                 ("result", "left")):
        t.add_column(c, justify=j, no_wrap=c != "shape", overflow="fold", min_width=widest if c == "shape" else None)
    for r in report.tensors:
        elementwise = r.mode != "fast" and r.checked  # directions alone give no per-element errors
        t.add_row(r.name, r.shape_text, r.mode, str(r.checked), str(r.skipped),
                  _fmt(r.max_abs) if elementwise else "-", _fmt(r.max_rel) if elementwise else "-",
                  _fmt(r.sym_rel) if r.checked else "-", _status(r.status))  # (nothing compared: no figures)
    s = report.settings
    t.caption = " ".join(f"{k}={v}" for k, v in s.items())
    return t


def title(report) -> str:
    """The check's name with the options each shape configuration built it with:
    ``Linear(units=4, use_bias=True); Linear(units=2, use_bias=True)``, or inside a config's
    report ``model[0] Linear(units=64, use_bias=True)``."""
    if not report.built:
        return report.layer
    built = "; ".join(b["layer"] for b in report.built)
    name = report.built[0]["layer"].split("(")[0]
    return report.layer[:-len(name)] + built if report.layer.endswith(name) else f"{report.layer}: {built}"


def tensor_line(r) -> str:
    """``x: happy; largest gap x[5,1]: analytic 0.0148774, numeric 0.0148775 (2.1e-09)`` for a
    PASS; a FAIL names its worst element, with the tolerance and where it was seen."""
    if r.status == NA:
        return f"{r.name}: not compared: the difference of each of its {r.skipped} element(s) crossed a kink"
    line = f"{r.name}: {r.band}"
    passed = r.status == PASS and r.largest is not None
    w = r.largest if passed else r.worst
    if w is None:
        return line
    if not passed and abs(w.analytic - w.numeric) <= w.tol:  # failed for its structure (the notes say how)
        return (f"{r.name}: FAIL for the reason below; where compared, backward and the differences agree "
                f"({r.band})")
    if passed and w.analytic == w.numeric:
        return line + "; backward and finite differences agree exactly on every element"
    line += (f"; {'largest gap' if passed else 'worst'} {r.name}[{','.join(map(str, w.index))}]: "
             f"analytic {w.analytic:.6g}, numeric {w.numeric:.6g}")
    return line + (f" ({abs(w.analytic - w.numeric):.1e})" if passed else f" (tol {w.tol:.1e}; {w.where})")


def print_report(report, shown: set | None = None) -> None:
    """The report, then its children's (a CONFIG.yaml's layers); ``shown``: the warnings printed
    so far, which a child repeats (the float32 and device warnings) and is not printed again."""
    shown = set() if shown is None else shown
    for w in report.warnings:
        if w not in shown:
            shown.add(w)
            err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if report.tensors:
        out.print(tensor_table(report))
    else:  # (the table's title names it otherwise)
        out.print(f"gradcheck {title(report)}", markup=False, soft_wrap=True)
    for r in report.tensors:
        out.print(f"  {tensor_line(r)}", markup=False, soft_wrap=True)
        for n in r.notes:  # a grad-structure problem already starts with the tensor's name
            out.print(f"  {n}" if n.startswith(f"{r.name}: ") else f"  {r.name}: {n}", markup=False, soft_wrap=True)
    if report.kinks and (report.kinks["redrawn"] or report.kinks["near"] or report.kinks.get("crossed")):
        out.print(f"  {kinks_line(report.kinks)}", markup=False, soft_wrap=True)
    for a in report.aux:
        if a.status == NA and not a.detail:  # (not run; one with a detail was not judged, and says why)
            continue
        out.print(f"  aux {a.name:<17} {_status(a.status)}" + (f"  {escape(a.detail)}" if a.detail else ""), soft_wrap=True)
    for c in report.children:
        out.print("")
        print_report(c, shown)
    if report.error:
        out.print(f"  [bold yellow]error:[/] {escape(report.error)}", soft_wrap=True)
    failed = report.failed
    tail = f" ({', '.join(failed)})" if failed and report.verdict != PASS else ""
    unchecked = [t.name for t in report.tensors if t.status == NA]
    if unchecked and not tail:
        tail = f" (not compared: {', '.join(unchecked)})"
    out.print(f"RESULT {escape(report.layer)}: {_status(report.verdict)}{escape(tail)}  [dim]{report.seconds:.2f}s[/]", soft_wrap=True)


def kinks_line(k: dict) -> str:
    """What redrawing away from kinks did (report.kinks)."""
    margin = f"--kink-margin {k['margin']:.1e}"
    if "float32_margin" in k:  # points differenced in float32 (no float64 copy) were held to the wider one
        margin += f" ({k['float32_margin']:.1e} where differences were taken in float32)"
    parts = []
    if k["redrawn"] or k["near"]:
        parts.append(f"{k['redrawn']} point draw(s) within {margin} of a kink were redrawn")
    if k["near"]:
        parts.append(f"{k['near']} point(s) still within it after --resample redraws were checked (elements whose "
                     f"difference crosses a kink are skipped when the layer has a branch_signature)")
    if k.get("crossed"):
        parts.append(f"{k['crossed']} point draw(s) with over 1% of their differences crossing a kink were redrawn")
    return "kinks: " + "; ".join(parts)


def summary_table(reports) -> Table:
    """One row per check, one line each at 80 columns: the band is that of the largest sym rel
    among the check's tensors; what failed is listed below the table (see problem_lines), and
    each tensor's figures are in ``dlrun gradcheck NAME`` and in --json."""
    t = Table(title="gradcheck --all", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              padding=(0, 1), collapse_padding=True)
    for c, j in (("name", "left"), ("checked", "right"), ("skipped", "right"), ("sym rel", "right"),
                 ("band", "left"), ("time", "right"), ("result", "left")):
        t.add_column(c, justify=j, no_wrap=True)
    for r in reports:
        rel = max((x.sym_rel for x in r.tensors), default=0.0)
        t.add_row(r.layer, str(sum(x.checked for x in r.tensors)), str(sum(x.skipped for x in r.tensors)),
                  _fmt(rel) if r.tensors else "-", band(rel) if r.tensors else "-", f"{r.seconds:.2f}s",
                  _status(r.verdict))
    return t


def problem_lines(reports) -> list[str]:
    """``  BatchNorm: FAIL x`` for each check that did not pass: its failing tensors and auxiliary
    checks, or its error."""
    return [f"  {escape(r.layer)}: {_status(r.verdict)} {escape(', '.join(r.failed) if r.failed else (r.error or ''))}"
            for r in reports if r.verdict != PASS]


def parse_sets(name: str, items: list[str]) -> dict:
    """``--set k=0.3`` items as layer options (values parsed like YAML, validated on build)."""
    raw: dict = {"type": name}
    for item in items:
        apply_override(raw, item, Source(None))
    raw.pop("type")
    return raw


# ``dlrun gradcheck``'s checker options are the fields of gradcheck.Settings, their help the
# field's entry in its docstring: declared once
HIDDEN = ("float32_eps", "float32_kink_margin")  # derived from --eps and --kink-margin (Settings.resolved)
METAVARS = {"dtype": "float64|float32", "mode": "|".join(MODES), "phase": "|".join(PHASES), "device": "cpu|gpu",
            "dims": "N=7,D=3,..."}


def _documented(cls) -> dict[str, str]:
    """Each ``name: text`` entry of a class docstring's ``Args:`` section, its lines joined."""
    entries, name = {}, None
    doc = inspect.getdoc(cls) or ""
    for line in doc.split("Args:", 1)[-1].splitlines():
        head = re.match(r"^    (\w+): (.*)", line)
        if head:
            name = head[1]
            entries[name] = head[2]
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
    return entries


def settings_options(exclude: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """The typer parameters of the checker options, one per field of :class:`Settings` (but
    those in ``exclude``: ``dlrun check`` has a --device of its own)."""
    helps, hints = _documented(Settings), typing.get_type_hints(Settings)
    params = []
    for f in fields(Settings):
        if f.name in HIDDEN or f.name in exclude:
            continue
        hint = hints[f.name]
        kind = next((t for t in (bool, int, float) if hint is t or t in typing.get_args(hint)), str)
        annotation = Optional[kind] if f.default is None else kind
        option = typer.Option(f.default, f"--{f.name.replace('_', '-')}", help=helps[f.name],
                              metavar=METAVARS.get(f.name))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return params


def gradcheck_cmd(target: Optional[str], set_: list[str], plugin: list[str], all_: bool, json_: bool,
                  **options) -> None:
    """Check backward passes against central finite differences. Exit 0 PASS, 1 FAIL, 2 cannot run.

    `dlrun check NAME` runs the same check of a layer, loss or regularizer (`dlrun check
    CONFIG.yaml` is a dry run of one training step instead).
    """
    load_plugins(plugin)
    settings = Settings(**options).resolved()
    if all_:
        if target is not None:
            raise UsageError(f"give either a name / config or --all, not both (got {target!r} and --all)")
        with (err.status("gradcheck --all") if err.is_terminal else nullcontext()) as status:
            show = None if status is None else (lambda name, i, n: status.update(f"gradcheck --all: {i}/{n} {name}"))
            reports = check_all(settings, on_start=show)
        if json_:
            out.print_json(json.dumps([r.to_dict() for r in reports], default=float))
        else:
            out.print(summary_table(reports))
            for line in problem_lines(reports):
                out.print(line)
            for w in dict.fromkeys(w for r in reports for w in r.warnings):  # each once (float32, device)
                err.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
            bad = [r.layer for r in reports if r.verdict != PASS]
            kinds = ", ".join(f"{len(r.names())} {r.plural}" for r in (registry.layers, registry.losses,
                                                                           registry.regularizers))
            out.print(f"RESULT {len(reports) - len(bad)}/{len(reports)} PASS ({kinds})"
                      + (f"; not passing: {', '.join(bad)}" if bad else ""))
        raise typer.Exit(1 if any(r.verdict != PASS for r in reports) else 0)
    if target is None:
        raise UsageError("give a layer, loss or regularizer name (dlrun list), a CONFIG.yaml, or --all")
    check_one(target, set_, json_, settings)


def check_one(target: str, set_: list[str], json_: bool, settings: Settings) -> None:
    """Gradient-check one layer, loss or regularizer, or a CONFIG.yaml's model, print the report
    (or its JSON) and exit 0 PASS, 1 FAIL, 2 cannot run: ``dlrun gradcheck TARGET``, and
    ``dlrun check NAME`` for a registered component."""
    if target.endswith((".yaml", ".yml")) or Path(target).is_file():
        report = check_config(target, set_, settings)
    elif target in registry.losses and target not in registry.layers:
        report = check_loss(target, parse_sets(target, set_), settings)
    elif target in registry.regularizers and target not in registry.layers:
        report = check_regularizer(target, parse_sets(target, set_), settings)
    elif target not in registry.layers:
        other = next((r for r in registry.REGISTRIES.values() if target in r), None)
        if other is not None:  # an optimizer, schedule, initializer or data generator: no backward to check
            raise UsageError(f"{target!r} is {other.article} {other.kind}, which has no backward pass to check; "
                             f"gradcheck checks layers, losses and regularizers (dlrun check CONFIG runs every "
                             f"component of a config once)")
        kinds = {r.plural: r.names() for r in CHECKED}
        names = [n for group in kinds.values() for n in group]
        raise UsageError(f"unknown layer, loss or regularizer {target!r}{did_you_mean(target, names)}; "
                         + "; ".join(f"{k}: {', '.join(v)}" for k, v in kinds.items()))
    else:
        report = check_layer(target, parse_sets(target, set_), settings)
    if json_:
        out.print_json(report.to_json())
    else:
        print_report(report)
    raise typer.Exit(EXIT[report.verdict])


_COMMAND = [
    inspect.Parameter("target", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Optional[str],
                      default=typer.Argument(None, help="Layer (e.g. LargeMarginFC), loss (e.g. Hinge) or regularizer "
                                                        "(e.g. L1) name, or a CONFIG.yaml.")),
    inspect.Parameter("set_", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
                      default=typer.Option([], "--set", metavar="OPTION=VALUE",
                                           help="Layer option (or, for a config, KEY.PATH=VALUE override); "
                                                "repeatable.")),
    inspect.Parameter("plugin", inspect.Parameter.KEYWORD_ONLY, annotation=list[str], default=PLUGIN),
    inspect.Parameter("all_", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--all", help="Check every registered layer, loss and regularizer "
                                                                "(plugins' too).")),
    inspect.Parameter("json_", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--json", help="Print the report as JSON.")),
]
gradcheck_cmd.__signature__ = inspect.Signature(_COMMAND + settings_options())
app.command("gradcheck")(gradcheck_cmd)
