"""HOST:PORT on the command line."""

from __future__ import annotations

from ecofl.errors import UserError


def parse_address(text: str, allow_any_port: bool = False) -> tuple[str, int]:
    """HOST:PORT; with ``allow_any_port`` port 0 (any free port) too."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not (0 if allow_any_port else 1) <= int(port) < 65536:
        raise UserError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)
