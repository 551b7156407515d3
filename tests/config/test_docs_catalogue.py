"""The components table of docs/config.md names only registered components, each in its row's
registry (a renamed or removed component must not linger in the docs)."""
from __future__ import annotations

import re
from pathlib import Path

from dlrun import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_every_name_in_the_components_table_is_registered_where_it_says():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and "|---" not in line]
    table = {cells[2]: cells[3] for cells in (line.split("|") for line in rows) if len(cells) > 4}
    registries = {"layers": registry.layers, "initializers": registry.initializers, "losses": registry.losses,
                  "regularizers": registry.regularizers, "optimizers": registry.optimizers,
                  "schedules": registry.schedules, "data generators": registry.data, "metrics": registry.metrics}
    checked = 0
    for kind, examples in table.items():
        reg = registries.get(kind.strip())
        if reg is None:  # the header row
            continue
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", re.sub(r"\([^)]*\)", "", examples)):
            assert name in reg.names(), f"docs/config.md names {name!r} as one of the {kind.strip()}, but it is not registered"
            checked += 1
    assert checked >= 40, checked  # the table was read (a changed layout must not pass silently)
