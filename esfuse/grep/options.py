"""GNU grep's command line, read the way grep 3.x reads it, for what the planner needs.

esgrep always ends by running the real grep with the caller's arguments
unchanged, so this parser never has to reproduce grep's behaviour: it extracts
the patterns, the dialect, case handling, the modes in which files without a
match print something (-v, -L, -c), recursion, and the file operands. Anything
it does not understand exactly (an unknown or ambiguous option, --help, -f -,
standard input) yields a `Passthrough`, and grep runs with no planning at all,
which is always correct.

getopt_long rules followed: option clusters (`-rni`), attached or separate
arguments (`-e P`, `-eP`, `--include=G`, `--include G`), unique prefixes of long
options, `--`, permutation of options and operands unless POSIXLY_CORRECT is set,
`-NUM` context digits.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # esgrep imports this on every call: `collections` is 3 ms of it
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SHORT_WITH_ARG = set("ABCDXdefm")
SHORT_FLAGS = set("0123456789EFGHILPRTUVZabchilnoqrsuvwxyz")

# long name -> (takes an argument: "yes" / "no" / "optional", the short option it acts as)
LONG: dict[str, tuple[str, str]] = {
    "extended-regexp": ("no", "E"),
    "fixed-strings": ("no", "F"),
    "fixed-regexp": ("no", "F"),
    "basic-regexp": ("no", "G"),
    "perl-regexp": ("no", "P"),
    "regexp": ("yes", "e"),
    "file": ("yes", "f"),
    "ignore-case": ("no", "i"),
    "no-ignore-case": ("no", "no-ignore-case"),
    "word-regexp": ("no", "w"),
    "line-regexp": ("no", "x"),
    "null-data": ("no", "z"),
    "no-messages": ("no", "s"),
    "invert-match": ("no", "v"),
    "version": ("no", "V"),
    "help": ("no", "help"),
    "max-count": ("yes", "m"),
    "byte-offset": ("no", "b"),
    "line-number": ("no", "n"),
    "line-buffered": ("no", "line-buffered"),
    "with-filename": ("no", "H"),
    "no-filename": ("no", "h"),
    "label": ("yes", "label"),
    "only-matching": ("no", "o"),
    "quiet": ("no", "q"),
    "silent": ("no", "q"),
    "binary-files": ("yes", "binary-files"),
    "text": ("no", "a"),
    "directories": ("yes", "d"),
    "devices": ("yes", "D"),
    "recursive": ("no", "r"),
    "dereference-recursive": ("no", "R"),
    "include": ("yes", "include"),
    "exclude": ("yes", "exclude"),
    "exclude-from": ("yes", "exclude-from"),
    "exclude-dir": ("yes", "exclude-dir"),
    "files-without-match": ("no", "L"),
    "files-with-matches": ("no", "l"),
    "count": ("no", "c"),
    "initial-tab": ("no", "T"),
    "null": ("no", "Z"),
    "before-context": ("yes", "B"),
    "after-context": ("yes", "A"),
    "context": ("yes", "C"),
    "group-separator": ("yes", "group-separator"),
    "no-group-separator": ("no", "no-group-separator"),
    "color": ("optional", "color"),
    "colour": ("optional", "color"),
    "binary": ("no", "U"),
    "unix-byte-offsets": ("no", "u"),
}


# Plain classes, not dataclasses: importing `dataclasses` would double esgrep's start-up.


class Passthrough:
    """Run grep as it is: esgrep cannot plan this call (the reason says why)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Passthrough({self.reason!r})"


class GrepCall:
    """What the planner and the daemon need to know about one grep call."""

    def __init__(self) -> None:
        self.patterns: list[bytes] = []
        self.dialect = "G"
        self.ignore_case = False
        self.every_file = False  # -v, -L, -c: files without a match can print too
        self.recursive = False
        self.operands: list[str] = []

    def __repr__(self) -> str:
        return f"GrepCall({self.__dict__!r})"


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


def _long(arg: str) -> tuple[str, str, str | None]:
    """(canonical name, argument kind, inline value) of a `--name[=value]` argument."""
    name, eq, value = arg[2:].partition("=")
    if name in LONG:
        full = name
    else:
        matches = {LONG[n] for n in LONG if n.startswith(name)}
        if len(matches) != 1 or not name:
            raise _Stop(f"unknown or ambiguous option --{name}")
        full = next(n for n in LONG if n.startswith(name))
    kind, _ = LONG[full]
    if eq and kind == "no":
        raise _Stop(f"--{full} takes no argument")
    return full, kind, value if eq else None


def _read_pattern_file(path: str) -> list[bytes]:
    if path == "-":
        raise _Stop("patterns on standard input")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        raise _Stop(f"cannot read pattern file {path}") from None
    if not data:
        return []
    return (data[:-1] if data.endswith(b"\n") else data).split(b"\n")


class _State:
    def __init__(self) -> None:
        self.call = GrepCall()
        self.explicit_patterns = False

    def apply(self, option: str, value: str | None) -> None:
        call = self.call
        if option in ("E", "F", "G", "P"):
            call.dialect = option
        elif option in ("i", "y"):
            call.ignore_case = True
        elif option == "no-ignore-case":
            call.ignore_case = False
        elif option in ("v", "L", "c"):
            call.every_file = True
        elif option in ("r", "R"):
            call.recursive = True
        elif option == "d":
            call.recursive = value == "recurse"
        elif option == "e":
            assert value is not None
            call.patterns.extend(os.fsencode(value).split(b"\n"))
            self.explicit_patterns = True
        elif option == "f":
            assert value is not None
            call.patterns.extend(_read_pattern_file(value))
            self.explicit_patterns = True
        elif option in ("V", "help", "X"):
            raise _Stop(f"option {option}")


def _short_cluster(arg: str, rest: list[str], state: _State) -> None:
    """`-abc`, `-e PATTERN`, `-ePATTERN`, `-5`: consumes from `rest` when an argument follows."""
    j = 1
    while j < len(arg):
        c = arg[j]
        if c in SHORT_WITH_ARG:
            value = arg[j + 1 :]
            if not value:
                if not rest:
                    raise _Stop(f"option -{c} needs an argument")
                value = rest.pop(0)
            state.apply(c, value)
            return
        if c not in SHORT_FLAGS:
            raise _Stop(f"unknown option -{c}")
        state.apply(c, None)
        j += 1


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> GrepCall | Passthrough:
    """Read grep's arguments; a Passthrough when esgrep should not plan this call."""
    env = os.environ if env is None else env
    permute = "POSIXLY_CORRECT" not in env
    state = _State()
    operands: list[str] = []
    rest = list(argv)
    try:
        while rest:
            arg = rest.pop(0)
            if arg == "--":
                operands.extend(rest)
                break
            if arg.startswith("--"):
                name, kind, value = _long(arg)
                if kind == "yes" and value is None:
                    if not rest:
                        raise _Stop(f"option --{name} needs an argument")
                    value = rest.pop(0)
                state.apply(LONG[name][1], value)
            elif arg.startswith("-") and arg != "-":
                _short_cluster(arg, rest, state)
            elif permute:
                operands.append(arg)
            else:
                operands.append(arg)
                operands.extend(rest)
                break
    except _Stop as stop:
        return Passthrough(stop.reason)
    call = state.call
    if not state.explicit_patterns:
        if not operands:
            return Passthrough("no pattern")
        call.patterns = os.fsencode(operands.pop(0)).split(b"\n")
    if (not operands and not call.recursive) or "-" in operands:
        return Passthrough("reads standard input")
    call.operands = operands or ["."]
    return call
