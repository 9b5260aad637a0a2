"""Benchmarks write their measured tables into a marked section of their page in ``docs/``."""

from __future__ import annotations

from pathlib import Path

START, END = "<!-- benchmark:start -->", "<!-- benchmark:end -->"


def replace_section(doc: Path, table: str) -> bool:
    """Replace the text between ``START`` and ``END`` in ``doc`` with ``table``; False when ``doc`` has no section."""
    text = doc.read_text() if doc.exists() else ""
    if START not in text or END not in text:
        return False
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{START}\n{table}\n{END}{tail}")
    return True
