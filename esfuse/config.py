"""Settings from a TOML file, under the command line and the environment.

The file holds option names (as on the command line, without dashes) at the
top level, for every command that has them, and in per-command tables::

    es = "https://es.example.com:9200"
    api-key-file = "/etc/esfuse/docs.key"
    index = "docs"

    [mount]
    groups = ["billing"]
    cache-size = "512M"

Precedence: flags, then ESFUSE_* environment variables, then the file, then
defaults (the file becomes click's default map, which sits exactly there).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

from esfuse.errors import EsfuseError


def _param_for(command: click.Command, key: str) -> click.Parameter | None:
    return next((p for p in command.params if f"--{key}" in getattr(p, "opts", ())), None)


def _value(value: object) -> object:
    # Lists read naturally in TOML; the options take comma-separated strings.
    return ",".join(map(str, value)) if isinstance(value, list) else value


def default_map(path: Path, group: click.Group) -> dict[str, dict[str, Any]]:
    """click's default map for every subcommand of `group`, from the TOML file at `path`."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise EsfuseError(f"cannot read configuration {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise EsfuseError(f"configuration {path} is not valid TOML: {e}") from None
    commands = group.commands
    shared = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for name, table in data.items():
        if isinstance(table, dict) and name not in commands:
            raise EsfuseError(f"configuration {path}: no command {name!r}")
    result: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for name, command in commands.items():
        table = data.get(name, {})
        settings = {**shared, **(table if isinstance(table, dict) else {})}
        mapping = {}
        for key, value in settings.items():
            param = _param_for(command, key)
            if param is None:
                if key in table:
                    raise EsfuseError(f"configuration {path}: {name} has no option --{key}")
                continue
            used.add(key)
            mapping[param.name] = _value(value)
        result[name] = mapping
    unknown = sorted(set(shared) - used)
    if unknown:
        raise EsfuseError(f"configuration {path}: unknown setting {unknown[0]!r}")
    return result
