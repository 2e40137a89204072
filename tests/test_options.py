"""Pure units: reading grep's command line the way grep 3.x does."""

import pytest

from esfuse.grep.options import GrepCall, Passthrough, parse


def call(*argv, env=None) -> GrepCall:
    result = parse(list(argv), env or {})
    assert isinstance(result, GrepCall), result
    return result


def test_pattern_then_operands_with_permuted_options():
    c = call("token", "docs", "-rn", "more")
    assert c.patterns == [b"token"] and c.operands == ["docs", "more"] and c.recursive


def test_posixly_correct_stops_at_the_first_operand():
    c = call("token", "docs", "-i", env={"POSIXLY_CORRECT": "1"})
    assert c.operands == ["docs", "-i"] and not c.ignore_case


def test_e_and_f_forms_collect_every_pattern(tmp_path):
    patterns = tmp_path / "p"
    patterns.write_bytes(b"one\ntwo\n")
    c = call("-e", "a", "-eb", "--regexp=c", "--regexp", "d\ne", "-f", patterns, "-r", "x")
    assert c.patterns == [b"a", b"b", b"c", b"d", b"e", b"one", b"two"]
    assert c.operands == ["x"]
    assert isinstance(parse(["-f", str(tmp_path / "missing"), "-r"], {}), Passthrough)


def test_an_empty_pattern_file_means_no_pattern(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    assert call("-r", "-f", tmp_path / "empty", "dir").patterns == []


def test_dialect_and_case_last_one_wins():
    c = call("-E", "-F", "-i", "--no-ignore-case", "-y", "p", "-r")
    assert c.dialect == "F" and c.ignore_case
    assert call("--extended-regexp", "-G", "p", "-r").dialect == "G"
    assert not call("-i", "--no-ignore-case", "p", "-r").ignore_case


@pytest.mark.parametrize(
    "flag",
    ["-v", "-L", "-c", "--count", "--invert-match", "--files-without-match", "-rvn", "--inv"],
)
def test_modes_where_non_matching_files_print_plan_every_file(flag):
    assert call(flag, "p", "-r").every_file


def test_options_with_arguments_are_skipped_not_taken_for_patterns():
    c = call(
        "-m",
        "3",
        "-A",
        "2",
        "-C1",
        "--include",
        "*.md",
        "--exclude=x",
        "--exclude-dir",
        "d",
        "--color=never",
        "--label",
        "L",
        "-d",
        "recurse",
        "pattern",
        "a",
        "-5",
    )
    assert c.patterns == [b"pattern"] and c.operands == ["a"] and c.recursive
    assert call("--binary-files=without-match", "-I", "p", "-r").operands == ["."]


def test_recursion_without_operands_searches_the_working_directory():
    assert call("-r", "p").operands == ["."]
    assert call("--directories=recurse", "p").operands == ["."]


def test_unique_prefixes_of_long_options():
    assert call("--ignore", "p", "-r").ignore_case
    assert call("--fixed", "p", "-r").dialect == "F"
    assert call("--inc=*.md", "p", "-r").patterns == [b"p"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["-V"],
        ["--frobnicate", "p", "x"],
        ["--co", "p", "x"],  # ambiguous: --count, --color, --colour, --context
        ["-Q", "p", "x"],
        ["p"],  # standard input
        ["p", "-"],
        ["-f", "-", "-r"],
        ["-e"],
        ["--count=3", "p", "x"],
        [],
        ["-X", "egrep", "p", "x"],
    ],
)
def test_what_esgrep_cannot_plan_goes_to_grep_unchanged(argv):
    assert isinstance(parse(argv, {}), Passthrough)


def test_double_dash_ends_options():
    c = call("-r", "--", "-v", "-x")
    assert c.patterns == [b"-v"] and c.operands == ["-x"] and not c.every_file
