"""Pure units: the grep planner never loses a line GNU grep selects.

GNU grep itself is the oracle: random patterns over a small alphabet rich in
metacharacters, random lines; every line grep selects must satisfy the plan.
"""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esfuse.grep.plan import ALL, NOTHING, And, Or, Sub, fold, java_lower, matches, plan
from esfuse.grep.regex import UNKNOWN, parse

LETTERS = list("abcABsSſkKKσςΣé日 -.$^*\\[](){}|+?")
META = [
    ".",
    "*",
    "+",
    "?",
    "|",
    "(",
    ")",
    "[ab]",
    "[^a]",
    "[a-c]",
    "[[:alpha:]]",
    "[]a]",
    "{2}",
    "{1,3}",
    "{,2}",
    "\\{1,2\\}",
    "\\|",
    "\\(",
    "\\)",
    "\\+",
    "\\?",
    "^",
    "$",
    "\\b",
    "\\<",
    "\\w",
    "\\W",
    "\\1",
    "\\.",
    "\\*",
    "\\",
    "{",
    "}",
    "x*",
    "[.]",
    "\\s",
]


def grep_selected(pattern: str, lines: list[str], flags: list[str]) -> list[str] | None:
    """The lines GNU grep selects, or None if grep rejects the pattern."""
    done = subprocess.run(
        ["grep", "-n", *flags, "-e", pattern],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env={"LC_ALL": "C.UTF-8"},
    )
    if done.returncode == 2:
        return None
    return [lines[int(row.split(":", 1)[0]) - 1] for row in done.stdout.splitlines()]


patterns = st.lists(st.sampled_from(LETTERS + META), min_size=1, max_size=8).map("".join)
texts = st.lists(
    st.lists(st.sampled_from(LETTERS), max_size=12).map("".join), min_size=1, max_size=12
)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern=patterns, lines=texts, dialect=st.sampled_from("GEF"), icase=st.booleans())
def test_every_line_grep_selects_satisfies_the_plan(pattern, lines, dialect, icase):
    flags = [f"-{dialect}"] + (["-i"] if icase else [])
    selected = grep_selected(pattern, lines, flags)
    if selected is None:
        return
    query = plan([pattern], dialect=dialect, ignore_case=icase)
    for line in selected:
        assert matches(query, line), (pattern, flags, line, query)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    words=st.lists(
        st.text(alphabet="".join(LETTERS), min_size=1, max_size=6), min_size=1, max_size=4
    ),
    lines=texts,
    icase=st.booleans(),
)
def test_several_fixed_strings_at_once(words, lines, icase):
    selected = grep_selected("\n".join(words), lines, ["-F"] + (["-i"] if icase else []))
    query = plan(words, dialect="F", ignore_case=icase)
    for line in selected or []:
        assert matches(query, line)


@pytest.mark.parametrize(
    "pattern, dialect, icase, expected",
    [
        ("access_token", "G", False, Sub("access_token")),
        ("# OAuth", "F", False, Sub("# OAuth")),
        ("<tip>", "G", False, Sub("<tip>")),
        ("a&b ~/.ssh", "F", False, Sub("a&b ~/.ssh")),
        ("foo.*bar", "G", False, And((Sub("foo"), Sub("bar")))),
        ("colou?r", "E", False, Or((Sub("color"), Sub("colour")))),
        ("colou\\?r", "G", False, Or((Sub("color"), Sub("colour")))),
        ("colou?r", "G", False, Sub("colou?r")),  # BRE: ? is literal
        ("(abc|abd)ef", "E", False, Or((Sub("abcef"), Sub("abdef")))),
        ("\\(abc\\|abd\\)ef", "G", False, Or((Sub("abcef"), Sub("abdef")))),
        ("(abc|abd)ef", "G", False, Sub("(abc|abd)ef")),
        ("ab+cde", "E", False, Sub("cde")),
        ("token", "G", True, Sub("token")),
        ("\\<word\\>", "G", False, Sub("word")),
        ("^# Title$", "G", False, Sub("# Title")),
        ("[[:digit:]]\\{3\\}-abc", "G", False, Sub("-abc")),
        ("\\(abc\\)\\1", "G", False, Sub("abc")),
    ],
)
def test_plans_are_selective_where_they_can_be(pattern, dialect, icase, expected):
    assert plan([pattern], dialect=dialect, ignore_case=icase) == expected


@pytest.mark.parametrize(
    "pattern, dialect",
    [
        (".*", "G"),
        ("", "G"),
        ("ab", "F"),
        ("x*", "E"),
        ("a|bcd", "E"),
        ("[a-z]+", "E"),
        ("\\w+", "E"),
        ("token", "P"),
        ("abc\\|", "G"),
    ],
)
def test_unselective_patterns_plan_every_file(pattern, dialect):
    assert plan([pattern], dialect=dialect, ignore_case=False) == ALL


def test_no_pattern_selects_nothing_and_one_unselective_pattern_selects_all():
    assert plan([], dialect="G", ignore_case=False) == NOTHING
    assert plan(["token", ".*"], dialect="G", ignore_case=False) == ALL


def test_undecodable_patterns_plan_every_file():
    assert plan(["caf\udce9 ok"], dialect="F", ignore_case=False) == ALL


def test_case_folding_covers_what_grep_equates():
    assert fold("s") == {"s", "ſ"} and fold("S") == {"s", "ſ"}
    assert fold("k") == {"k"}  # Kelvin sign lowercases to k in the index
    assert fold("σ") == fold("Σ") == {"σ", "ς"}
    assert fold("i") == {"i", "ı"}
    assert java_lower("İI") == "ii" and java_lower("ΟΔΟΣ") == "οδοσ"


def test_unbalanced_or_unknown_syntax_claims_nothing():
    for pattern in ["(abc", "abc)", "[abc", "a\\", "\\(abc"]:
        node = parse(pattern, extended=True)
        query = plan([pattern], dialect="E", ignore_case=False)
        assert node == UNKNOWN or query == ALL or isinstance(query, Sub), pattern
