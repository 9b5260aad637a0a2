"""A bad Hydra override is one line with the valid choices, said before anything starts.

Hydra reports a config group option that does not exist (``strategy=fedprox``)
in sixteen lines with the search path. :func:`check_overrides` composes the
configuration with the command line's overrides first (each value of a
multirun's comma list in turn) and turns a composition error into one
:class:`~ecofl.errors.UserError` line: the override, what is wrong, and the
valid options where Hydra knows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from ecofl.errors import UserError

CONF = Path(__file__).resolve().parents[1] / "conf"


def sweep_values(override: str) -> list[str]:
    """``key=a,b`` as ``[key=a, key=b]`` (a multirun's sweep); anything else as itself."""
    key, sep, value = override.partition("=")
    if not sep or any(c in value for c in "[]{}()'\"") or "," not in value:
        return [override]
    return [f"{key}={part}" for part in value.split(",")]


def check_overrides(argv: Sequence[str], config_name: str = "config") -> None:
    """Compose ``config_name`` with the overrides in ``argv`` (options and ``hydra.*`` left out); a UserError
    naming the first bad one."""
    overrides = [arg for arg in argv if not arg.startswith("-") and not arg.lstrip("+~").startswith("hydra")]
    choices = [sweep_values(override) for override in overrides]
    first = [values[0] for values in choices]
    trials = [first] + [first[:i] + [value] + first[i + 1:] for i, values in enumerate(choices) for value in values[1:]]
    for trial in trials:
        try:
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                compose(config_name, overrides=trial)
        except MissingConfigException as error:
            group = str(error).split("'")[3].rsplit("/", 1)[0] if str(error).count("'") >= 4 else "the group"
            bad = next((o for o in trial if o.lstrip("+~").split("=")[0] == group), " ".join(trial))
            valid = f"; valid {group} options: {', '.join(error.options)}" if error.options else ""
            raise UserError(f"{bad}: no such {group}{valid}") from None
        except (HydraException, OmegaConfBaseException) as error:
            raise UserError(_one_line(trial, error, config_name)) from None


def _one_line(trial: list[str], error: Exception, config_name: str) -> str:
    """A composition error in one line; an unknown setting with the settings its section has."""
    text = str(error)
    if text.startswith("Could not override '"):
        key = text.split("'")[1]
        section, _, name = key.rpartition(".")
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            config = compose(config_name)
        node = config.get(section) if section else config
        known = f"; {section or 'the config'} has {', '.join(sorted(node))}" if hasattr(node, "keys") else ""
        return f"{key}: no such setting{known}"
    lines = [line.strip() for line in text.splitlines() if line.strip() and "hydra.cc" not in line]
    return f"{' '.join(trial)}: {' '.join(lines[:2])}"
