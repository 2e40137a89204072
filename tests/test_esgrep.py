"""esgrep against GNU grep: over the mount, and over the local source, byte for byte.

esgrep's contract: stdout, stderr and exit status equal GNU grep's with the same
arguments over the mounted tree (exactly, order included). Over the local source
the same lines come out, in the disk's directory order, so that comparison is of
sorted lines.
"""

from __future__ import annotations

import math
import os
import random
import re
import socket
import struct
import sys
from pathlib import Path

import pytest

from esfuse import protocol
from esfuse.cache import PREFETCH_BATCH_KEYS
from esfuse.store import FIRST_PAGE, SEARCH_PAGE
from tests.conftest import Docs, corpus, mount_or_fail, run, status, unmount

pytestmark = [pytest.mark.es, pytest.mark.mount]

ESGREP = str(Path(sys.executable).parent / "esgrep")

HOSTILE = [
    "# OAuth",
    "<tip>",
    "user@x.com",
    "a&b",
    "~/.ssh",
    "access_token",
    "ccess_tok",
    "Bearer $TOKEN",
    "naïve café",
    "ドキュメント",
    "🚀",
    "ſ",
    "foo(bar)",
    "[x]",
    "{y}",
    "a.b*c",
    "ΑΒΓ",
    "Straße",
]
REGEXES = [
    ("-G", "^# "),
    ("-G", "token.*header$"),
    ("-E", "colou?r|OAuth"),
    ("-G", "entry 4[0-9]*7 of"),
    ("-G", "\\(to\\)ken"),
    ("-E", "(to)ken \\1"),
    ("-G", "[[:digit:]]\\{3\\}"),
    ("-E", "[A-Z][a-z]+ [0-9]{2,}"),
    ("-G", "\\<api\\>"),
    ("-E", "a{"),
    ("-G", "a\\{1"),
    ("-E", "(unclosed"),
    ("-G", "[unclosed"),
    ("-G", ""),
    ("-E", ".*"),
    ("-G", "x\\|Page 1$"),
    ("-P", "acc\\w+_tok"),
    ("-E", "naïve|日本"),
]
OPTION_SETS = [
    ["-rn"],
    ["-ri"],
    ["-rl"],
    ["-rL"],
    ["-rc"],
    ["-rv"],
    ["-rw"],
    ["-rx"],
    ["-ro"],
    ["-rh"],
    ["-rH", "-m", "1"],
    ["-rq"],
    ["-rs"],
    ["-rZ", "-l"],
    ["-rI"],
    ["-r", "-A", "1"],
    ["-r", "-C", "2", "-n"],
    ["-r", "-B1"],
    ["-r", "--include=*.md"],
    ["-r", "--include", "*.txt"],
    ["-r", "--exclude=*.md"],
    ["-r", "--exclude-dir=wide"],
    ["-r", "--binary-files=text"],
    ["-r", "--color=always"],
    ["-r", "--color=never", "-n"],
    ["-rF"],
    ["-rFi"],
    ["-rFx"],
    ["-rE", "-o", "-i"],
    ["-R", "-c", "-i"],
    ["-r", "-y"],
    ["-ri", "--no-ignore-case"],
    ["-r", "--null", "-c"],
    ["-r", "-b"],
    ["-r", "--label=x", "-H"],
    ["-r", "-T", "-n"],
]


def outcome(argv: list[str], cwd: Path, program: str = "grep") -> tuple[int, bytes, bytes]:
    done = run(program, *argv, cwd=cwd)
    return done.returncode, done.stdout, done.stderr


def compare(argv: list[str], mounted: Path, src: Path, sub: str = ".") -> None:
    ours = outcome(argv, mounted / sub, ESGREP)
    over_mount = outcome(argv, mounted / sub)
    assert ours == over_mount, (
        argv,
        ours[0],
        over_mount[0],
        ours[1][:500],
        over_mount[1][:500],
        ours[2][:500],
        over_mount[2][:500],
    )
    local = outcome(argv, src / sub)
    assert ours[0] == local[0], (argv, ours, local)
    for got, want in ((ours[1], local[1]), (ours[2], local[2])):
        assert sorted(re.split(b"[\n\0]", got)) == sorted(re.split(b"[\n\0]", want)), argv


@pytest.mark.parametrize("pattern", HOSTILE)
def test_hostile_literals(mounted, fixture_src, pattern):
    compare(["-rn", "--", pattern], mounted, fixture_src)
    compare(["-rniF", "--", pattern.swapcase()], mounted, fixture_src)


@pytest.mark.parametrize("flag, pattern", REGEXES)
def test_regexes(mounted, fixture_src, flag, pattern):
    compare(["-rn", flag, "--", pattern], mounted, fixture_src)


@pytest.mark.parametrize("options", OPTION_SETS, ids=" ".join)
def test_option_sets(mounted, fixture_src, options):
    for pattern in ("token", "OAuth", "entry 12"):
        compare([*options, "--", pattern, "."], mounted, fixture_src)


@pytest.mark.parametrize(
    "argv, sub",
    [
        (["-rn", "token"], "."),  # no operand: grep searches . and prints bare names
        (["-rn", "token", "guide", "api"], "."),
        (["-n", "token", "guide/quickstart.mdx", "README.md"], "."),
        (["-n", "token", "quickstart.mdx"], "guide"),
        (["-rn", "token", "../api", "."], "guide"),
        (["-rn", "token", "missing-dir", "guide"], "."),
        (["-r", "-e", "OAuth", "-e", "Bearer", "."], "."),
        (["-rn", "six levels", "a/b/c"], "."),
        (["token", "-r", "guide", "-n"], "."),
        (["-r", "access_token", "assets"], "."),
        (["-rc", "access_token", "assets"], "."),
        (["-ra", "access_token", "assets"], "."),
        (["-r", "café", "assets", "café"], "."),
    ],
)
def test_operands_and_cwd(mounted, fixture_src, argv, sub):
    compare(argv, mounted, fixture_src, sub)


def sampled_patterns(src: Path, count: int, seed: int) -> list[str]:
    """Substrings of real lines, metacharacters and all, some with their case changed."""
    rng = random.Random(seed)
    files = sorted(p for p in src.rglob("*") if p.is_file() and p.stat().st_size < 200_000)
    patterns: list[str] = []
    while len(patterns) < count:
        lines = rng.choice(files).read_text(errors="replace").splitlines()
        line = rng.choice(lines) if lines else ""
        if len(line) < 6:
            continue
        start = rng.randrange(len(line) - 4)
        piece = line[start : start + rng.randrange(4, 14)]
        patterns.append(piece.swapcase() if rng.random() < 0.3 else piece)
    return patterns


def test_patterns_sampled_from_the_fixture(mounted, fixture_src):
    rng = random.Random(3)
    for pattern in sampled_patterns(fixture_src, 30, seed=1):
        flags = rng.choice([["-rn"], ["-rni"], ["-rl"], ["-rnF"], ["-rniE"], ["-rc"]])
        compare([*flags, "--", pattern], mounted, fixture_src)


def test_patterns_sampled_from_the_mintlify_corpus(es_url, es, tmp_path_factory):
    src = corpus("mintlify-docs", tmp_path_factory)
    d = Docs(es_url, es, src, prefix="mintlify-grep")
    mountpoint = tmp_path_factory.mktemp("mintlify-grep") / "m"
    try:
        assert d.ingest().returncode == 0
        mount_or_fail(d, mountpoint)
        rng = random.Random(5)
        for pattern in [*sampled_patterns(src, 40, seed=2), "<Tip>", "# OAuth", "~/.ssh"]:
            flags = rng.choice(
                [["-rn"], ["-rni"], ["-rl"], ["-rnF"], ["-rniw"], ["-rc"], ["-rnE"], ["-rL"]]
            )
            compare([*flags, "--", pattern], mountpoint, src)
    finally:
        unmount(mountpoint)
        d.drop()


# -- outside a mount, and when things go wrong --------------------------------------


def test_outside_a_mount_esgrep_is_grep(fixture_src):
    for argv in (
        ["-rn", "OAuth", "."],
        ["--frobnicate", "x"],
        ["-rn", "a\\{1", "."],
        ["--help"],
        ["-V"],
    ):
        assert outcome(argv, fixture_src, ESGREP) == outcome(argv, fixture_src)
    done = run(ESGREP, "-c", "tip", input=b"a tip\nno\ntip tip\n")
    assert (done.returncode, done.stdout) == (0, b"2\n")


def test_a_mount_path_mixed_with_a_local_path_is_still_grep(mounted, fixture_src):
    argv = ["-rn", "OAuth", str(mounted / "guide"), str(fixture_src / "guide")]
    assert outcome(argv, fixture_src, ESGREP) == outcome(argv, fixture_src)


def test_few_searches_and_bulk_fetches_per_call(docs, tmp_path):
    # No preload, whose requests would be counted too.
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--no-preload")
    try:
        before = status(mountpoint)["requests"]
        assert before == {}
        # The kernel keeps this full listing; grep's session must not be shown it.
        assert len(os.listdir(mountpoint / "wide")) == 5000
        done = run(ESGREP, "-rl", "entry 4", "wide", cwd=mountpoint, text=True)
        found = done.stdout.splitlines()
        assert len(found) == 1111  # pages 4, 40-49, 400-499, 4000-4999
        # grep read the 1111 candidates after the daemon prefetched them in bulk:
        # its reads were served from the cache, with no request of their own.
        after = status(mountpoint)["requests"]
        # The first, small page of hits also counted them; one more page had the rest.
        searches = 1 + math.ceil((1111 - FIRST_PAGE) / SEARCH_PAGE)
        assert after == {"search": searches, "content": math.ceil(1111 / PREFETCH_BATCH_KEYS)}
        # ... nor may anyone else be shown the session's narrowed listing.
        assert len(os.listdir(mountpoint / "wide")) == 5000
    finally:
        unmount(mountpoint)


def test_a_pattern_most_files_may_match_reads_everything_after_one_request(
    docs, fixture_src, tmp_path
):
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--no-preload")
    try:
        # "of the wide directory" is in 5000 of the fixture's files: more than half.
        request = {"op": "grep", "patterns": ["wide directory"], "dialect": "F"}
        answer = protocol.call(
            protocol.socket_of(mountpoint), {**request, "scopes": [""], "every_file": False}, 10
        )
        assert answer["mode"] == "all"
        assert status(mountpoint)["requests"]["search"] == 1  # counted, not listed
        ours = run(ESGREP, "-rl", "wide directory", ".", cwd=mountpoint, text=True)
        theirs = run("grep", "-rl", "wide directory", ".", cwd=fixture_src, text=True)
        assert ours.returncode == theirs.returncode == 0
        assert sorted(ours.stdout.splitlines()) == sorted(theirs.stdout.splitlines())
        assert len(ours.stdout.splitlines()) == 5000
    finally:
        unmount(mountpoint)


def test_once_the_kernel_holds_the_tree_a_fifth_of_it_matching_reads_everything(
    docs, fixture_src, tmp_path
):
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--no-preload")
    request = {"op": "grep", "patterns": ["entry 4"], "dialect": "F", "scopes": [""]}
    files = sum(1 for p in fixture_src.rglob("*") if p.is_file())
    try:

        def mode() -> str:
            path = protocol.socket_of(mountpoint)
            return protocol.call(path, {**request, "every_file": False}, 10)["mode"]

        # 1111 files match: listing them beats reading every file from Elasticsearch ...
        assert 0.1 < 1111 / files < 0.5
        assert mode() == "filtered"
        run("grep", "-r", "-q", "no such text anywhere", ".", cwd=mountpoint)
        # ... but not reading every file from the kernel's memory.
        assert mode() == "all"
        ours = run(ESGREP, "-rl", "entry 4", ".", cwd=mountpoint, text=True)
        theirs = run("grep", "-rl", "entry 4", ".", cwd=fixture_src, text=True)
        assert ours.returncode == theirs.returncode == 0
        # (A local directory lists in its own order.)
        assert sorted(ours.stdout.splitlines()) == sorted(theirs.stdout.splitlines())
    finally:
        unmount(mountpoint)


def test_a_dead_daemon_is_one_line_and_exit_2(docs, tmp_path):
    mountpoint = mount_or_fail(docs, tmp_path / "m")
    try:
        socket_path = Path(protocol.socket_of(mountpoint))
        socket_path.unlink()
        done = run(ESGREP, "-r", "token", mountpoint, text=True)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and str(mountpoint) in done.stderr
        assert "remount" in done.stderr
    finally:
        unmount(mountpoint)


def test_elasticsearch_failing_is_one_line_and_exit_2(es_url, es, fixture_src, tmp_path):
    d = Docs(es_url, es, fixture_src / "guide", prefix="esgrep-down")
    mountpoint = tmp_path / "m"
    try:
        assert d.ingest().returncode == 0
        mount_or_fail(d, mountpoint)
        es.indices.delete(index=f"{d.name}-files")
        done = run(ESGREP, "-r", "token", mountpoint, text=True)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.startswith(f"esgrep: {mountpoint}: searching: Elasticsearch answered")
        assert done.stderr.count("\n") == 1
    finally:
        unmount(mountpoint)
        d.drop()


# -- the control socket --------------------------------------------------------------


def raw(path: str, payload: bytes, timeout: float = 10) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    "payload, error",
    [
        (frame(b"not json"), "not JSON"),
        (frame(b'{"v": 1, "op": "status"} {}'), "not JSON"),
        (frame(b'{"v": 1, "op": "\xff"}'), "not JSON"),
        (frame(b"[" * 100_000), "nested too deeply"),
        (frame(b"[1, 2]"), "JSON object"),
        (frame(b'{"v": 99, "op": "status"}'), "protocol version"),
        (frame(b'{"v": 1, "op": "format-disk"}'), "unknown op"),
        (
            frame(b'{"v": 1, "op": "grep", "patterns": "x", "scopes": [], "dialect": "G"}'),
            "patterns must be a list",
        ),
        (
            frame(
                b'{"v": 1, "op": "grep", "patterns": ["x"], "scopes": ["../etc"], "dialect": "G"}'
            ),
            "outside the mount",
        ),
        (
            frame(
                b'{"v": 1, "op": "grep", "patterns": ["x"], "scopes": ["/a/../../b"],'
                b' "dialect": "G"}'
            ),
            "outside the mount",
        ),
        (
            frame(b'{"v": 1, "op": "grep", "patterns": ["x"], "scopes": [], "dialect": "Q"}'),
            "unknown dialect",
        ),
        (struct.pack(">I", protocol.MAX_FRAME + 1) + b"{}", "exceeds"),
        (b"\x00\x00", "connection closed"),
        (frame(b'{"v": 1, "op"')[:-3], "connection closed"),
    ],
)
def test_malformed_requests_are_refused_and_the_daemon_keeps_serving(mounted, payload, error):
    path = protocol.socket_of(mounted)
    body = raw(path, payload)
    response = protocol.decode(body[4:])
    assert response["ok"] is False and error in response["error"], response
    assert status(mounted)["files"] > 5000


def test_the_socket_is_owner_only_and_survives_a_flood(mounted):
    path = Path(protocol.socket_of(mounted))
    assert (path.stat().st_mode & 0o777) == 0o600
    for i in range(300):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(os.urandom(i % 50))
    assert status(mounted)["files"] > 5000


def test_a_daemon_that_does_not_answer_in_time_is_one_line_and_exit_2(mounted):
    done = run(
        ESGREP, "-r", "token", mounted, text=True, env={**os.environ, "ESGREP_TIMEOUT": "0.000001"}
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == f"esgrep: {mounted}: the esfuse daemon did not answer within 1e-06 s "
        "(ESGREP_TIMEOUT)\n"
    )


def test_patterns_from_a_file(mounted, fixture_src, tmp_path):
    patterns = tmp_path / "patterns"
    patterns.write_text("OAuth\n<tip>\nentry 99 of\n")
    compare(["-rn", "-f", str(patterns)], mounted, fixture_src)
    compare(["-rc", "-F", "-f", str(patterns), "guide"], mounted, fixture_src)
    (tmp_path / "none").write_text("")
    compare(["-r", "-f", str(tmp_path / "none"), "."], mounted, fixture_src)
