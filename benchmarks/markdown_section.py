"""Benchmarks write their measured tables into a marked section of their page in ``docs/``.

A page holds one unnamed section (``<!-- benchmark:start -->`` ...
``<!-- benchmark:end -->``) and any number of named ones
(``<!-- benchmark:NAME:start -->`` ... ``<!-- benchmark:NAME:end -->``), so
that several benchmarks can write to one page without touching each other's
text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

START, END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def markers(name: str | None = None) -> tuple[str, str]:
    """The start and end markers of the section ``name`` (None: the page's unnamed section)."""
    if name is None:
        return START, END
    return f"<!-- benchmark:{name}:start -->", f"<!-- benchmark:{name}:end -->"


def replace_section(doc: Path, table: str, name: str | None = None) -> bool:
    """Replace the text between the section's markers in ``doc`` with ``table``; False when ``doc`` has no such
    section."""
    start, end = markers(name)
    text = doc.read_text() if doc.exists() else ""
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{start}\n{table}\n{end}{tail}")
    return True


def cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell (its pipes escaped)."""
    return text.replace("|", "\\|")


def publish(results: dict, json_path: Path, table: str, doc: Path, name: str) -> None:
    """Write ``results`` to ``json_path`` and ``table`` into ``doc``'s section ``name`` (said on stderr where
    ``doc`` has none), and print the table."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1))
    if not replace_section(doc, table, name):
        print(f"{doc} has no section {name!r}: the table is only printed", file=sys.stderr)
    print(table)
