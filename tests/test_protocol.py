"""Pure units: the control socket's frames and the mount table, as esgrep reads them."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from esfuse import mountinfo, protocol

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=30,
)


def same(a: object, b: object) -> bool:
    """Equal, with NaN equal to itself (json round-trips it as NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(JSON)
def test_frames_are_written_as_json_writes_them(value):
    assert protocol.dumps(value) == json.dumps(value, separators=(",", ":"))


@given(JSON, st.sampled_from([",", ", ", ",\n  "]), st.sampled_from(["", " ", "\n\t "]))
def test_frames_are_read_as_json_reads_them(value, separator, around):
    text = around + json.dumps(value, separators=(separator, ": ")) + around
    assert same(protocol.loads(text), json.loads(text))


@pytest.mark.parametrize("text", ["", "nul", '{"a": 1} {}', '{"a": 1,}', "[1, 2", '"\x01"', "01"])
def test_what_json_refuses_is_a_value_error(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        protocol.loads(text)


def test_what_json_cannot_write_is_refused():
    with pytest.raises(TypeError, match="set is not JSON serializable"):
        protocol.dumps({"a": {1}})
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ValueError):
        protocol.dumps(looped)


def test_a_frame_nested_too_deeply_is_a_protocol_error():
    with pytest.raises(protocol.ProtocolError, match="nested too deeply"):
        protocol.decode(b"[" * 100_000)


@given(st.binary())
def test_mount_table_fields_are_unescaped_as_the_kernel_escapes_them(field):
    # The kernel's rule (fs/seq_file.c: mangle_path), as a regular expression.
    expected = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), field)
    assert mountinfo._unescaped(field) == expected.decode("utf-8", "surrogateescape")


def test_a_mount_point_with_spaces_and_backslashes_is_read_back():
    assert mountinfo._unescaped(b"/mnt/my\\040docs\\134x\\011y") == "/mnt/my docs\\x\ty"


STATUS = {
    "ok": True,
    "index": "docs",
    "tree_version": 3,
    "files": 10,
    "tree_age": 5.0,
    "tree_load_ms": 12.0,
    "last_refresh_error": None,
    "cache_bytes": 1000,
    "cache_hits": 1,
    "cache_misses": 1,
    "preload": "done",
    "handed_to_kernel": 9,
    "from_local_disk": 9,
    "requests": {"content": 1},
    "latency_ms": {"p50": 1.0},
    "rss_bytes": 50_000_000,
    "pid": 123,
    "uptime": 6.0,
}


@pytest.mark.parametrize(
    "drop, shown",
    [
        (None, "9 files in the kernel, 9 of them from local disk"),
        ("from_local_disk", "9 files in the kernel, 0 of them from local disk"),  # older daemon
        ("cache_hits", None),
    ],
)
def test_status_of_a_daemon_of_another_version_is_shown_or_one_line(monkeypatch, drop, shown):
    from click.testing import CliRunner

    from esfuse import cli

    answer = {k: v for k, v in STATUS.items() if k != drop}
    monkeypatch.setattr(cli.protocol, "socket_of", lambda mountpoint: "/run/esfuse/x.sock")
    monkeypatch.setattr(cli.protocol, "call", lambda path, request, timeout: answer)
    result = CliRunner().invoke(cli.main, ["status", "/mnt/docs"])
    if shown:
        assert result.exit_code == 0 and shown in result.output
    else:
        assert result.exit_code == 1
        assert "Traceback" not in result.output
        assert "status is not what this esfuse expects (KeyError: 'cache_hits')" in result.output
