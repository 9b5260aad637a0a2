"""The home's secret: from a file or the environment, never the command line (where ``ps`` shows it)."""

from __future__ import annotations

import os
from pathlib import Path

from ecofl.errors import UserError
from ecofl.net.auth import SECRET_ENV

SECRET_FILE_ENV = "ECOFL_HOME_SECRET_FILE"


def read_secret(path: str | None = None) -> bytes:
    """The secret in ``path`` (hex, or raw bytes of 16 or more), else in $ECOFL_HOME_SECRET_FILE or
    $ECOFL_HOME_SECRET."""
    path = path or os.environ.get(SECRET_FILE_ENV)
    if path:
        try:
            data = Path(path).read_bytes().strip()
        except OSError as error:
            raise UserError(f"cannot read the home secret file {path}: {error.strerror}") from None
        origin = path
    elif os.environ.get(SECRET_ENV):
        data, origin = os.environ[SECRET_ENV].strip().encode(), f"${SECRET_ENV}"
    else:
        raise UserError(f"no home secret: pass --secret-file, or set {SECRET_FILE_ENV} or {SECRET_ENV}")
    try:
        secret = bytes.fromhex(data.decode())
    except (UnicodeDecodeError, ValueError):
        secret = data
    if len(secret) < 16:
        raise UserError(f"the home secret in {origin} is too short: at least 16 bytes (32 hex digits)")
    return secret


def write_secret(path: str | Path) -> bytes:
    """A fresh secret, written as hex to ``path`` with mode 600."""
    secret = os.urandom(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret.hex() + "\n")
    return secret
