"""Result records of a check, and their JSON form. Library code returns these; the CLI prints."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

PASS, FAIL, ERROR, NA = "PASS", "FAIL", "ERROR", "n/a"
# cs231n's reading of a relative error (informative: pass/fail is the tolerance rule). It is
# applied to sym_rel, a norm-wise error: the elementwise max_rel is dominated by rounding on
# elements whose gradient is near 0 (an identity layer's reaches 2e-6 in float64)
BANDS = ((1e-7, "happy"), (1e-4, "ok with kinks"), (1e-2, "uneasy"))


def band(rel: float) -> str:
    """happy < 1e-7 ≤ ok with kinks < 1e-4 ≤ uneasy < 1e-2 ≤ wrong."""
    return next((name for limit, name in BANDS if rel < limit), "wrong")


@dataclass
class Worst:
    """One element of a tensor: the one furthest outside tolerance (``worst``; when all pass, the
    one closest to it) or the one with the largest gap abs(a − n) (``largest``)."""

    index: tuple
    analytic: float
    numeric: float
    tol: float
    where: str  # phase, dims and point it was seen at


@dataclass
class TensorResult:
    """One checked tensor (an input or a parameter), aggregated over every point checked.

    ``checked`` counts compared elements (elementwise modes) plus directions (fast mode);
    ``skipped`` counts elements whose finite difference crossed a kink. ``max_rel`` is the largest
    abs(a − n)/max(abs(a), abs(n)) (0 where both are below 1e-12), ``sym_rel`` the largest
    ‖a − n‖₂/‖a + n‖₂ of a point (Oxford), both over every point; ``band`` reads sym_rel.
    """

    name: str
    role: str  # "input" or "param"
    shapes: list = field(default_factory=list)
    dtype: str = ""
    mode: str = ""
    checked: int = 0
    skipped: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sym_rel: float = 0.0
    worst: Worst | None = None
    largest: Worst | None = None
    status: str = PASS
    notes: list = field(default_factory=list)

    @property
    def band(self) -> str:
        # a tensor none of whose elements was compared (its backward failed first) has no band
        return band(self.sym_rel) if self.checked else "not compared"

    @property
    def shape_text(self) -> str:
        return " ".join("(" + ",".join(map(str, s)) + ")" for s in self.shapes)


@dataclass
class AuxResult:
    """One auxiliary check (zero-upstream, reentrant, ...), aggregated over every point."""

    name: str
    status: str = NA
    detail: str = ""


def new_report(name: str, settings, keys=None) -> "LayerReport":
    """An empty report headed by the (resolved) settings that shape it, with their warnings."""
    return LayerReport(name, settings.header(keys), warnings=settings.warnings())


@dataclass
class LayerReport:
    """Everything a check of one layer (or one whole model) found."""

    layer: str
    settings: dict
    tensors: list = field(default_factory=list)
    aux: list = field(default_factory=list)
    error: str | None = None  # "backward raised IndexError: ... (train, N=3 D=5 C=4, point 1)"
    warnings: list = field(default_factory=list)
    seconds: float = 0.0
    children: list = field(default_factory=list)  # per-layer reports of a whole-model check
    kinks: dict | None = None  # redrawn points: {"margin", "redrawn", "near", "crossed"} (gradcheck.kinks.Dodge)
    # the layer as each shape configuration built it, with its options: {"layer": "Linear(units=4,
    # use_bias=True)", "options": {...}} (gradcheck.inputs.built_with)
    built: list = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        names = [t.name for t in self.tensors if t.status == FAIL]
        names += [a.name for a in self.aux if a.status == FAIL]
        names += [f"{c.layer}: {', '.join(c.failed) or c.verdict}" for c in self.children if c.verdict != PASS]
        return names

    @property
    def verdict(self) -> str:
        if any(t.status == FAIL for t in self.tensors) or any(a.status == FAIL for a in self.aux):
            return FAIL
        if any(c.verdict == FAIL for c in self.children):  # a failure found outranks a part that could not run
            return FAIL
        if self.error or any(c.verdict != PASS for c in self.children):
            return ERROR
        return PASS

    def to_dict(self) -> dict:
        d = asdict(self)
        d["result"] = self.verdict
        d["failed"] = self.failed
        for t, td in zip(self.tensors, d["tensors"]):
            td["shape"] = td.pop("shapes")
            td["band"] = t.band
            for key in ("worst", "largest"):
                if getattr(t, key) is not None:
                    td[key]["index"] = list(getattr(t, key).index)
        d["children"] = [c.to_dict() for c in self.children]
        return d

    def to_json(self) -> str:
        """Strict JSON: a NaN or infinite number (a layer that produced one) is written as null."""
        return json.dumps(_json_safe(self.to_dict()), indent=2, allow_nan=False, default=str)


def _json_safe(v):
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def merge(results: dict, run) -> None:
    """Fold one tensor's check at one point (a numeric.TensorRun) into its TensorResult."""
    t = results.setdefault(run.name, TensorResult(run.name, run.role, dtype=run.dtype))
    if list(run.shape) not in t.shapes:
        t.shapes.append(list(run.shape))
    if run.mode not in t.mode.split(","):
        t.mode = ",".join(m for m in (t.mode, run.mode) if m)
    t.checked += run.checked
    t.skipped += run.skipped
    t.max_abs = max(t.max_abs, run.max_abs)
    t.max_rel = max(t.max_rel, run.max_rel)
    t.sym_rel = max(t.sym_rel, run.sym_rel)
    if run.worst is not None:
        ex = lambda w: np.nan_to_num(abs(w.analytic - w.numeric) - w.tol, nan=np.inf)  # noqa: E731  (NaN: the worst)
        if t.worst is None or ex(run.worst) > ex(t.worst):
            t.worst = run.worst
    if run.largest is not None:
        gap = lambda w: abs(w.analytic - w.numeric)  # noqa: E731
        if t.largest is None or gap(run.largest) > gap(t.largest):
            t.largest = run.largest
    if run.failed:
        t.status = FAIL
    elif t.status != FAIL:  # nothing compared (every element crossed a kink) is not a pass
        t.status = NA if t.checked == 0 and t.skipped > 0 else PASS
    for n in run.notes:
        if n not in t.notes and len(t.notes) < 4:
            t.notes.append(n)
