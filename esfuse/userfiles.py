"""Reading the JSON files users hand to esfuse (access rules, manifests)."""

from __future__ import annotations

import json
from pathlib import Path

from esfuse.errors import EsfuseError


def read_json(path: Path, what: str) -> object:
    """The parsed file; an unreadable or malformed one is a one-line EsfuseError."""
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise EsfuseError(f"cannot read {what} {path}: {e.strerror}") from None
    except ValueError as e:
        raise EsfuseError(f"{what} {path} is not valid JSON: {e}") from None
