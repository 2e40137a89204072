"""From grep patterns to a coarse query that every matching file satisfies.

A plan is a boolean formula over "the file's text contains S" (S at least three
characters, matched as a phrase of trigrams in Elasticsearch). It must be a
superset: whenever grep would select a line of a file, the file satisfies the
plan. The construction follows Russ Cox's trigram-index planner, simplified:

- each node of the syntax tree yields either its *exact* set of strings (when
  small) or a formula; a literal is exact, UNKNOWN is the formula ALL;
- concatenation crosses exact sets; when a set would grow too big, or a node is
  not exact, what was gathered so far becomes a formula and is ANDed;
- alternation unions exact sets or ORs formulas (an OR with ALL is ALL);
- repetition: `x?` and small bounded counts stay exact, `x{n,}` keeps its
  mandatory first copies, `x*` is ALL.

Dropping an AND operand or widening a node to ALL is always safe; dropping an
OR operand never is, so the code never does.

Case: the index lowercases with Java's `Character.toLowerCase`, per code point.
The query text goes through the same analyzer, so a case-sensitive plan is
simply widened to "any case". Under -i, grep also equates characters whose
lowercase forms differ (`ſ` and `s`, final `ς` and `σ`, Kelvin `K` and `k`):
each character stands for every lowercase form in its case-fold class.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from esfuse.grep import regex
from esfuse.grep.regex import Alt, Chars, Concat, Empty, Node, Repeat, Unknown

MIN_LEN = 3
MAX_EXACT = 16
MAX_LEN = 48
MAX_CLAUSES = 256
MAX_FOLD = 4


# -- the formula ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class All:
    """True of every file."""


@dataclass(frozen=True, slots=True)
class Nothing:
    """True of no file (grep given no pattern at all)."""


@dataclass(frozen=True, slots=True)
class Sub:
    """The file's text contains this string (compared in lowercase)."""

    text: str


@dataclass(frozen=True, slots=True)
class And:
    terms: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Or:
    terms: tuple[Query, ...]


Query = All | Nothing | Sub | And | Or
ALL = All()
NOTHING = Nothing()


def sub(text: str) -> Query:
    return Sub(text[:MAX_LEN]) if len(text) >= MIN_LEN else ALL


def and_(terms: list[Query]) -> Query:
    flat: list[Query] = []
    for t in terms:
        if isinstance(t, Nothing):
            return NOTHING
        flat.extend(t.terms if isinstance(t, And) else () if isinstance(t, All) else (t,))
    unique = tuple(dict.fromkeys(flat))[:MAX_CLAUSES]  # fewer ANDed terms: still a superset
    return ALL if not unique else unique[0] if len(unique) == 1 else And(unique)


def or_(terms: list[Query]) -> Query:
    flat: list[Query] = []
    for t in terms:
        if isinstance(t, All):
            return ALL
        flat.extend(t.terms if isinstance(t, Or) else () if isinstance(t, Nothing) else (t,))
    unique = tuple(dict.fromkeys(flat))
    if len(unique) > MAX_CLAUSES:
        return ALL  # an OR may never lose a branch: give up instead
    return NOTHING if not unique else unique[0] if len(unique) == 1 else Or(unique)


def java_lower(text: str) -> str:
    """Lowercase per code point, as Lucene's LowerCaseFilter does.

    Python's `str.lower` differs in two ways we must avoid: it maps İ to two code
    points (Java: `i`), and it applies the final-sigma rule to whole words.
    """
    return "".join("i" if c == "İ" else c.lower() for c in text)


def matches(query: Query, text: str) -> bool:
    """Evaluate a plan on a text the way the index does; the definition of its meaning."""
    lowered = java_lower(text)
    return _eval(query, lowered)


def _eval(query: Query, lowered: str) -> bool:
    if isinstance(query, All):
        return True
    if isinstance(query, Nothing):
        return False
    if isinstance(query, Sub):
        return java_lower(query.text) in lowered
    if isinstance(query, And):
        return all(_eval(t, lowered) for t in query.terms)
    return any(_eval(t, lowered) for t in query.terms)


# -- case folding ------------------------------------------------------------------


@functools.cache
def _fold_classes() -> dict[str, frozenset[str]]:
    """Characters grep -i may equate: joined when one is another's lower, upper or casefold.

    A union-find over all cased code points (none above U+1FFFF has case); the
    classes are a superset of what glibc's towlower/towupper equate, which is
    the safe direction.
    """
    parent: dict[str, str] = {}

    def find(c: str) -> str:
        while parent.get(c, c) != c:
            c = parent[c]
        return c

    for code in range(0x20000):
        c = chr(code)
        for form in (c.lower(), c.upper(), c.casefold()):
            if len(form) == 1 and form != c:
                parent[find(form)] = find(c)
    classes: dict[str, set[str]] = defaultdict(set)
    for c in set(parent) | set(parent.values()):
        classes[find(c)].add(c)
    return {c: frozenset(members) for members in classes.values() for c in members}


def fold(char: str) -> frozenset[str] | None:
    """The lowercase forms grep -i may match for `char`, or None if too many to list."""
    forms = frozenset(java_lower(c) for c in _fold_classes().get(char, {char}))
    return forms if len(forms) <= MAX_FOLD else None


# -- planning ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Info:
    exact: frozenset[str] | None
    query: Query


def _exact_query(strings: frozenset[str]) -> Query:
    return or_([sub(s) for s in sorted(strings)])


def _query(info: _Info) -> Query:
    return _exact_query(info.exact) if info.exact is not None else info.query


def _exact(strings: frozenset[str]) -> _Info:
    return _Info(strings, ALL)


_UNKNOWN_INFO = _Info(None, ALL)


class _Planner:
    def __init__(self, ignore_case: bool) -> None:
        self.ignore_case = ignore_case

    def info(self, node: Node) -> _Info:
        if isinstance(node, Chars):
            return self.chars(node)
        if isinstance(node, Unknown):
            return _UNKNOWN_INFO
        if isinstance(node, Empty):
            return _exact(frozenset({""}))
        if isinstance(node, Concat):
            return self.concat(node.parts)
        if isinstance(node, Alt):
            return self.alt(node.branches)
        return self.repeat(node)

    def chars(self, node: Chars) -> _Info:
        if not self.ignore_case:
            return _exact(node.options)
        forms: set[str] = set()
        for c in node.options:
            folded = fold(c)
            if folded is None:
                return _UNKNOWN_INFO
            forms |= folded
        return _exact(frozenset(forms)) if len(forms) <= regex.MAX_CLASS else _UNKNOWN_INFO

    def concat(self, parts: tuple[Node, ...]) -> _Info:
        conjuncts: list[Query] = []
        current: frozenset[str] | None = frozenset({""})
        for part in _expand_repeats(parts):
            info = self.info(part)
            if info.exact is not None and current is not None:
                if len(current) * len(info.exact) <= MAX_EXACT:
                    current = frozenset(a + b for a in current for b in info.exact)
                    continue
                conjuncts.append(_exact_query(current))
                current = info.exact
                continue
            if current is not None:
                conjuncts.append(_exact_query(current))
            if info.exact is not None:
                current = info.exact
            else:
                conjuncts.append(info.query)
                current = frozenset({""})
        if not conjuncts and current is not None:
            return _exact(current)
        if current is not None:
            conjuncts.append(_exact_query(current))
        return _Info(None, and_(conjuncts))

    def alt(self, branches: tuple[Node, ...]) -> _Info:
        infos = [self.info(b) for b in branches]
        if all(i.exact is not None for i in infos):
            union = frozenset().union(*(i.exact for i in infos if i.exact is not None))
            if len(union) <= MAX_EXACT:
                return _exact(union)
        return _Info(None, or_([_query(i) for i in infos]))

    def repeat(self, node: Repeat) -> _Info:
        inner = self.info(node.node)
        if inner.exact is None or node.high == regex.REPEAT_UNBOUNDED or node.high > 3:
            return _UNKNOWN_INFO if node.low == 0 else _Info(None, _query(inner))
        strings: set[str] = set()
        for count in range(node.low, node.high + 1):
            for combo in itertools.product(inner.exact, repeat=count):
                strings.add("".join(combo))
                if len(strings) > MAX_EXACT:
                    return _UNKNOWN_INFO if node.low == 0 else _Info(None, _query(inner))
        return _exact(frozenset(strings))


def _expand_repeats(parts: tuple[Node, ...]) -> list[Node]:
    """`x{n,m}` with n ≥ 1 inside a concatenation: its first copies join their neighbours."""
    out: list[Node] = []
    for part in parts:
        if (
            isinstance(part, Repeat)
            and part.low >= 1
            and (part.high == regex.REPEAT_UNBOUNDED or part.high > 3)
        ):
            mandatory = min(part.low, 3)
            out.extend([part.node] * mandatory)
            out.append(regex.UNKNOWN)  # the rest of the copies, and any beyond 3
        elif isinstance(part, Concat):
            out.extend(_expand_repeats(part.parts))
        else:
            out.append(part)
    return out


def plan(patterns: list[str], *, dialect: str, ignore_case: bool) -> Query:
    """The coarse query for grep run with these patterns (-G BRE, -E ERE, -F, -P)."""
    planner = _Planner(ignore_case)
    terms: list[Query] = []
    for pattern in patterns:
        if any("\udc80" <= c <= "\udcff" for c in pattern):
            return ALL  # bytes that are not UTF-8 never appear as such in the indexed text
        if dialect == "F":
            node: Node = regex.fixed(pattern)
        elif dialect in ("G", "E"):
            node = regex.parse(pattern, extended=dialect == "E")
        else:
            return ALL  # -P: Perl syntax is not parsed; every file is a candidate
        terms.append(_query(planner.info(node)))
    return or_(terms)


def to_elasticsearch(query: Query, field: str = "text") -> dict[str, Any]:
    if isinstance(query, All):
        return {"match_all": {}}
    if isinstance(query, Nothing):
        return {"match_none": {}}
    if isinstance(query, Sub):
        return {"match_phrase": {field: query.text}}
    clauses = [to_elasticsearch(t, field) for t in query.terms]
    if isinstance(query, And):
        return {"bool": {"filter": clauses}}
    return {"bool": {"should": clauses, "minimum_should_match": 1}}
