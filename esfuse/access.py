"""Who may see a file: access rules at ingest, viewers at mount.

A rules file assigns every path a visibility::

    {"default": {"public": true},
     "rules": [{"path": "internal/**", "public": false, "groups": ["admin", "billing"]}]}

`path` is a glob relative to the source directory (`**` crosses directories,
`*` and `?` do not, `[...]` is a class); rules apply in order and the last match
wins; no match means the default; with no rules file everything is public. A
directory matches a rule when its path, or its path with a trailing `/`, does.

A viewer is what a mount may see: public files, plus files sharing a group
with its groups; or everything (`--all`, for operators).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esfuse.errors import EsfuseError
from esfuse.userfiles import read_json


@dataclass(frozen=True, slots=True)
class Access:
    """A file's visibility, as stored with it in the tree and in Elasticsearch."""

    public: bool = True
    groups: tuple[str, ...] = ()

    @staticmethod
    def union(accesses: Iterable[Access]) -> Access:
        """Visible to whoever may see any of them (for content shared by several files)."""
        items = list(accesses)
        return Access(
            any(a.public for a in items), tuple(sorted({g for a in items for g in a.groups}))
        )


PUBLIC = Access()


@dataclass(frozen=True, slots=True)
class Viewer:
    """What one mount may see; `groups` None means everything."""

    groups: frozenset[str] | None = frozenset()

    def sees(self, access: Access) -> bool:
        return self.groups is None or access.public or not self.groups.isdisjoint(access.groups)

    def es_filter(self) -> dict[str, Any] | None:
        """The same test as a filter on `public`/`groups` fields; None: no filter."""
        if self.groups is None:
            return None
        should: list[dict[str, Any]] = [{"term": {"public": True}}]
        if self.groups:
            should.append({"terms": {"groups": sorted(self.groups)}})
        return {"bool": {"should": should, "minimum_should_match": 1}}


EVERYTHING = Viewer(None)


def glob_to_regex(glob: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            if glob.startswith("/", i):  # `a/**/b` also matches `a/b`
                out[-1] = "(?:.*/)?"
                i += 1
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = glob.find("]", i + 2)
            if end < 0:
                raise EsfuseError(f"unterminated [ in access rule path {glob!r}")
            body = glob[i + 1 : end]
            out.append(
                "["
                + (
                    "^" + re.escape(body[1:])
                    if body.startswith("!")
                    else re.escape(body).replace("\\-", "-")
                )
                + "]"
            )
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def _access(entry: object, where: str) -> Access:
    if not isinstance(entry, dict):
        raise EsfuseError(f"{where} must be an object")
    public = entry.get("public", True)
    groups = entry.get("groups", [])
    if not isinstance(public, bool):
        raise EsfuseError(f"{where}: 'public' must be true or false")
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise EsfuseError(f"{where}: 'groups' must be a list of names")
    return Access(public, tuple(sorted(set(groups))))


class Rules:
    """Ordered access rules with a default; `access_of` answers for one path."""

    def __init__(
        self, default: Access = PUBLIC, rules: list[tuple[re.Pattern[str], Access]] | None = None
    ) -> None:
        self.default = default
        self.rules = rules or []

    @classmethod
    def load(cls, path: Path) -> Rules:
        doc = read_json(path, "access rules")
        if not isinstance(doc, dict) or not isinstance(doc.get("rules", []), list):
            raise EsfuseError(f"access rules {path}: expected {{'default': ..., 'rules': [...]}}")
        default = _access(doc.get("default", {}), f"{path}: default")
        rules = []
        for n, rule in enumerate(doc.get("rules", [])):
            where = f"{path}: rule {n + 1}"
            glob = rule.get("path") if isinstance(rule, dict) else None
            if not isinstance(glob, str) or not glob:
                raise EsfuseError(f"{where}: 'path' must be a non-empty glob")
            rules.append((glob_to_regex(glob.strip("/")), _access(rule, where)))
        return cls(default, rules)

    def access_of(self, path: str, *, is_dir: bool = False) -> Access:
        found = self.default
        for pattern, access in self.rules:
            if pattern.fullmatch(path) or (is_dir and pattern.fullmatch(path + "/")):
                found = access
        return found
