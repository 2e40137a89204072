"""GNU grep patterns (BRE, ERE, fixed strings) parsed into a small syntax tree.

The tree only has to support one question, "which literal strings must a
matching line contain?", so it keeps what answers it and folds the rest into
`UNKNOWN` (matches any string). That choice is the safety net of the whole
planner: whenever this parser is unsure how grep reads a construct, it says
UNKNOWN, which only widens the candidate set. Known-literal is claimed only for
characters grep certainly treats as themselves.

Deliberately conservative readings (each one can only add candidates):
- `^` and `$` claim nothing and split literals: anchors at the ends of a
  pattern, but literal characters in the middle of a BRE;
- a quantifier with nothing before it, an interval that does not parse, a stray
  backslash escape, a bracket with ranges beyond ASCII, classes, equivalence
  classes or negation: all UNKNOWN;
- backreferences are UNKNOWN.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CLASS = 16
REPEAT_UNBOUNDED = -1


@dataclass(frozen=True, slots=True)
class Chars:
    """One character out of a known, small set."""

    options: frozenset[str]


@dataclass(frozen=True, slots=True)
class Unknown:
    """Any string at all, including the empty one."""


@dataclass(frozen=True, slots=True)
class Empty:
    """The empty string (anchors and other zero-width assertions)."""


@dataclass(frozen=True, slots=True)
class Concat:
    parts: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    branches: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    node: Node
    low: int
    high: int  # REPEAT_UNBOUNDED for no upper bound


Node = Chars | Unknown | Empty | Concat | Alt | Repeat
UNKNOWN = Unknown()
EMPTY = Empty()

_ZERO_WIDTH_ESCAPES = set("bB<>`'")
_ERE_INTERVAL = re.compile(r"\{(\d*)(,(\d*))?\}")
_BRE_INTERVAL = re.compile(r"\\\{(\d*)(,(\d*))?\\\}")
_DIGITS = frozenset("0123456789")


def literal(char: str) -> Chars:
    return Chars(frozenset(char))


def fixed(pattern: str) -> Node:
    """A -F pattern: every character stands for itself."""
    return Concat(tuple(literal(c) for c in pattern))


class _Parser:
    def __init__(self, pattern: str, extended: bool) -> None:
        self.s = pattern
        self.i = 0
        self.ere = extended
        self.depth = 0

    # -- helpers ---------------------------------------------------------------

    def peek(self, text: str) -> bool:
        return self.s.startswith(text, self.i)

    def at_alternation(self) -> bool:
        return self.peek("|") if self.ere else self.peek("\\|")

    def at_group_end(self) -> bool:
        return self.depth > 0 and (self.peek(")") if self.ere else self.peek("\\)"))

    # -- grammar ---------------------------------------------------------------

    def parse(self) -> Node:
        node = self.alternation()
        if self.i != len(self.s):
            # An unmatched close group or similar: grep decides; we claim nothing.
            return UNKNOWN
        return node

    def alternation(self) -> Node:
        branches = [self.concatenation()]
        while self.at_alternation():
            self.i += 1 if self.ere else 2
            branches.append(self.concatenation())
        return branches[0] if len(branches) == 1 else Alt(tuple(branches))

    def concatenation(self) -> Node:
        parts: list[Node] = []
        while self.i < len(self.s) and not self.at_alternation() and not self.at_group_end():
            parts.append(self.quantified(self.atom()))
        return Concat(tuple(parts)) if parts else EMPTY

    def quantified(self, node: Node | None) -> Node:
        while True:
            bounds = self.quantifier()
            if bounds is None:
                return UNKNOWN if node is None else node
            # A quantifier with nothing to repeat: grep may read it literally or not.
            node = UNKNOWN if node is None else Repeat(node, *bounds)

    def quantifier(self) -> tuple[int, int] | None:
        s, i = self.s, self.i
        if s.startswith("*", i):
            self.i += 1
            return 0, REPEAT_UNBOUNDED
        plus, question = ("+", "?") if self.ere else ("\\+", "\\?")
        if s.startswith(plus, i):
            self.i += len(plus)
            return 1, REPEAT_UNBOUNDED
        if s.startswith(question, i):
            self.i += len(question)
            return 0, 1
        m = (_ERE_INTERVAL if self.ere else _BRE_INTERVAL).match(s, i)
        if m and (m[1] or m[3]):
            self.i = m.end()
            low = int(m[1] or 0)
            high = low if m[2] is None else int(m[3]) if m[3] else REPEAT_UNBOUNDED
            return low, high
        return None

    def atom(self) -> Node | None:
        """The next atom; None where a quantifier stands with nothing before it."""
        s = self.s
        c = s[self.i]
        if self.quantifier_ahead():
            return None
        if (self.ere and c == "(") or (not self.ere and s.startswith("\\(", self.i)):
            return self.group()
        if c in "^$":
            # An anchor, or (in BRE, mid-pattern) a literal: either way no requirement,
            # and UNKNOWN keeps its neighbours from being joined across it.
            self.i += 1
            return UNKNOWN
        if c == ".":
            self.i += 1
            return UNKNOWN
        if c == "[":
            return self.bracket()
        if c == "\\":
            return self.escape()
        if self.ere and c in "{)":
            # `{` that is not an interval, `)` with no group open: GNU-specific readings.
            self.i += 1
            return UNKNOWN
        self.i += 1
        return literal(c)

    def quantifier_ahead(self) -> bool:
        save = self.i
        found = self.quantifier() is not None
        self.i = save
        return found

    def group(self) -> Node:
        self.i += 1 if self.ere else 2
        self.depth += 1
        inner = self.alternation()
        self.depth -= 1
        close = ")" if self.ere else "\\)"
        if not self.peek(close):
            self.i = len(self.s)  # unbalanced: grep reports it or reads it its own way
            return UNKNOWN
        self.i += len(close)
        return inner

    def escape(self) -> Node:
        if self.i + 1 >= len(self.s):
            self.i = len(self.s)
            return UNKNOWN
        c = self.s[self.i + 1]
        self.i += 2
        if c in _ZERO_WIDTH_ESCAPES:
            return EMPTY
        if c in ".[]*^$\\/" or (self.ere and c in "+?(){}|"):
            return literal(c)
        # \w \s \1..\9 and escapes grep warns about ("stray \"): claim nothing.
        return UNKNOWN

    def bracket(self) -> Node:
        """A bracket expression; only small sets of plain characters are kept."""
        s = self.s
        j = self.i + 1
        negated = s.startswith("^", j)
        if negated:
            j += 1
        members: set[str] = set()
        known = not negated
        first = True
        while j < len(s) and (first or s[j] != "]"):
            first = False
            if s.startswith(("[:", "[=", "[."), j):
                end = s.find(s[j + 1] + "]", j + 2)
                if end < 0:
                    break
                j = end + 2
                known = False
                continue
            c = s[j]
            if j + 2 < len(s) and s[j + 1] == "-" and s[j + 2] != "]":
                high = s[j + 2]
                if c.isascii() and high.isascii() and ord(c) <= ord(high):
                    members.update(chr(o) for o in range(ord(c), ord(high) + 1))
                else:
                    known = False
                j += 3
                continue
            members.add(c)
            j += 1
        if j >= len(s):
            self.i = len(s)  # unterminated: grep reports "Unmatched [" itself
            return UNKNOWN
        self.i = j + 1
        if not known or not members or len(members) > MAX_CLASS:
            return UNKNOWN
        return Chars(frozenset(members))


def parse(pattern: str, *, extended: bool) -> Node:
    """A BRE (extended=False) or ERE pattern as a syntax tree; never raises."""
    return _Parser(pattern, extended).parse()
