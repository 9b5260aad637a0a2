"""Errors a user can fix: the CLI prints them as one line, never a traceback."""


class UserError(ValueError):
    """Bad input (unknown name, impossible configuration, missing files)."""
