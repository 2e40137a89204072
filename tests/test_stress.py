"""Surviving abuse: a flood of bad control messages, and many readers on a small cache."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from esfuse import protocol
from esfuse.daemon import read_record
from tests.conftest import mount_or_fail, run, status, unmount

pytestmark = [pytest.mark.es, pytest.mark.mount]

ESGREP = str(Path(sys.executable).parent / "esgrep")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def garbage(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 64))  # noise
    if kind == 1:
        return struct.pack(">I", protocol.MAX_FRAME + rng.randrange(1, 1 << 20))  # oversized
    if kind == 2:
        return struct.pack(">I", 100) + b'{"v": 1, "op"'  # truncated
    if kind == 3:
        return protocol.encode({"op": "grep", "patterns": [1], "scopes": [], "dialect": "G"})
    if kind == 4:
        return protocol.encode(
            {"op": "grep", "patterns": ["x"], "scopes": ["../../etc"], "dialect": "E"}
        )
    return b'\x00\x00\x00\x05{"v":'  # bad JSON after a valid header


def send(path: str, payload: bytes) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass


def test_ten_thousand_bad_messages_leave_the_daemon_serving_and_flat(docs, tmp_path):
    mountpoint = mount_or_fail(docs, tmp_path / "m")
    try:
        pid = read_record(mountpoint)["pid"]
        path = protocol.socket_of(mountpoint)
        rng = random.Random(11)
        payloads = [garbage(rng) for _ in range(10_000)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: send(path, p), payloads[:1000]))  # warm up allocations
            before = rss_mb(pid)
            list(pool.map(lambda p: send(path, p), payloads[1000:]))
        assert status(mountpoint)["files"] > 5000
        assert rss_mb(pid) - before < 20, (before, rss_mb(pid))
        assert (mountpoint / "README.md").read_bytes() == (docs.src / "README.md").read_bytes()
    finally:
        unmount(mountpoint)


def test_sixteen_readers_on_a_cache_smaller_than_the_corpus(docs, tmp_path):
    seconds = int(float(os.environ.get("ESFUSE_STRESS_SECONDS", "60")))
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--cache-size", "2M")
    m = mountpoint
    try:
        pid = read_record(m)["pid"]
        loop = (
            # grep and esgrep exit 1 when nothing matches; 2 and above are errors.
            "end=$((SECONDS+{s})); while [ $SECONDS -lt $end ]; do {cmd} >/dev/null; "
            "status=$?; [ $status -le 1 ] || {{ echo exit status $status >&2; exit 1; }}; done"
        )
        commands = [
            f"grep -r -c token {m}",
            f"cat {m}/large/big.txt",
            f"find {m} -name '*.md'",
            f"{ESGREP} -rl OAuth {m}",
            f"{ESGREP} -rc 'entry 1[0-9]' {m}/wide",
            f"cat {m}/assets/logo.png {m}/wide/page-0042.md",
            f"grep -rl zzz-not-there {m}/guide {m}/api",
            f"{ESGREP} -rLi token {m}/guide",
        ] * 2
        procs = [
            subprocess.Popen(
                ["bash", "-c", loop.format(s=seconds, cmd=c)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in commands
        ]
        for p, c in zip(procs, commands, strict=True):
            _, err = p.communicate(timeout=seconds + 180)
            assert p.returncode == 0 and err == "", (c, err[-2000:])
        assert run("diff", "-r", m, docs.src).returncode == 0
        answer = status(m)
        assert answer["cache_bytes"] <= 2 << 20
        assert rss_mb(pid) < 250, rss_mb(pid)
    finally:
        unmount(mountpoint)
