"""docs/operator.md carries the knob mapping table exactly as the knob table generates it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from chunkpilot.api.docs import render_knob_table, render_reference
from chunkpilot.api.knobs import KNOBS

DOC = Path(__file__).resolve().parents[2] / "docs" / "operator.md"
BLOCK = re.compile(r"(<!-- knob-table:start -->\n)(.*?)(<!-- knob-table:end -->)", re.DOTALL)


def test_operator_docs_carry_the_generated_knob_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    match = BLOCK.search(text)
    assert match is not None, "docs/operator.md lost its knob-table markers"
    if os.environ.get("CHUNKPILOT_UPDATE_DOCS") == "1":
        DOC.write_text(BLOCK.sub(lambda m: m.group(1) + render_knob_table() + m.group(3), text))
        text = DOC.read_text(encoding="utf-8")
        match = BLOCK.search(text)
        assert match is not None
    assert match.group(2) == render_knob_table(), (
        "stale knob table: run CHUNKPILOT_UPDATE_DOCS=1 pytest tests/api/test_knob_docs.py"
    )


def test_the_table_has_one_line_per_knob_and_is_in_the_reference() -> None:
    table = render_knob_table()
    assert len(table.strip().splitlines()) == len(KNOBS) + 2
    assert all(f"| `{row.camel}` |" in table for row in KNOBS)
    assert table in render_reference()
