"""The mounted file system, driven by real programs over a real FUSE mount."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest

from esfuse import mountinfo, protocol
from esfuse.daemon import alive, force_unmount, read_record, record_path
from esfuse.store import CHUNK_SIZE
from tests.conftest import (
    ESFUSE,
    Docs,
    corpus,
    esfuse,
    mount_or_fail,
    run,
    status,
    unmount,
    wait_preloaded,
)

pytestmark = [pytest.mark.es, pytest.mark.mount]

PATTERNS = [
    "access_token",
    "OAuth",
    "# OAuth",
    "<tip>",
    "user@x.com",
    "a&b",
    "~/.ssh",
    "naïve",
    "ドキュメント",
    "^# ",
    "entry 4[0-9]*7 of",
    "token.*header$",
]


def test_diff_r_is_empty(mounted, fixture_src):
    done = run("diff", "-r", mounted, fixture_src)
    assert done.returncode == 0 and done.stdout == b"", done.stdout[:2000]


def test_find_lists_the_same_tree(mounted, fixture_src):
    def listing(root: Path) -> bytes:
        return run("find", ".", cwd=root, check=True).stdout

    assert sorted(listing(mounted).splitlines()) == sorted(listing(fixture_src).splitlines())


def test_stat_sizes_mtimes_modes_and_links(mounted, fixture_src):
    for src in fixture_src.rglob("*"):
        rel = src.relative_to(fixture_src)
        ours, theirs = os.stat(mounted / rel), os.stat(src)
        if src.is_dir():
            assert stat.S_IMODE(ours.st_mode) == 0o555 and stat.S_ISDIR(ours.st_mode)
            assert ours.st_nlink == 2 + sum(1 for c in src.iterdir() if c.is_dir()), rel
        else:
            assert stat.S_IMODE(ours.st_mode) == 0o444 and stat.S_ISREG(ours.st_mode)
            assert (ours.st_size, ours.st_mtime_ns) == (theirs.st_size, theirs.st_mtime_ns), rel
            assert ours.st_blocks * 512 >= ours.st_size
    big = os.stat(mounted / "large" / "big.txt")
    assert big.st_size == 5_000_000


def test_ls_lr_works(mounted):
    done = run("ls", "-lR", mounted)
    assert done.returncode == 0 and done.stderr == b""
    assert "naïve résumé.md".encode() in done.stdout


@pytest.mark.parametrize("pattern", PATTERNS)
def test_grep_rn_prints_what_it_prints_on_the_source(mounted, fixture_src, pattern):
    ours = run("grep", "-rn", "--", pattern, ".", cwd=mounted)
    theirs = run("grep", "-rn", "--", pattern, ".", cwd=fixture_src)
    assert ours.returncode == theirs.returncode
    assert sorted(ours.stdout.splitlines()) == sorted(theirs.stdout.splitlines())
    assert ours.stdout.count(b"\n") == theirs.stdout.count(b"\n")


def test_grep_rn_with_absolute_paths(mounted, fixture_src):
    ours = run("grep", "-rn", "Bearer", mounted).stdout.replace(bytes(mounted), b"ROOT")
    theirs = run("grep", "-rn", "Bearer", fixture_src).stdout.replace(bytes(fixture_src), b"ROOT")
    assert sorted(ours.splitlines()) == sorted(theirs.splitlines()) != []


WRITES = [
    "touch {m}/README.md",
    "touch {m}/new.md",
    "echo x > {m}/README.md",
    "echo x >> {m}/README.md",
    "rm {m}/README.md",
    "rmdir {m}/empty-dir",
    "mv {m}/README.md {m}/moved.md",
    "mkdir {m}/newdir",
    "ln {m}/README.md {m}/hard",
    "ln -s README.md {m}/soft",
    "chmod 777 {m}/README.md",
    "chown nobody {m}/README.md",
    "truncate -s 0 {m}/README.md",
    "setfattr -n user.x -v 1 {m}/README.md",
    "cp /etc/hostname {m}/copied",
]


@pytest.mark.parametrize("command", WRITES)
def test_every_write_fails_with_erofs(mounted, docs, command):
    before = (docs.count("chunks"), docs.count("files"), docs.count("meta"))
    done = run("bash", "-c", command.format(m=mounted), text=True)
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr, done.stderr
    assert (docs.count("chunks"), docs.count("files"), docs.count("meta")) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda m: os.open(m / "README.md", os.O_WRONLY),
        lambda m: os.open(m / "README.md", os.O_RDWR),
        lambda m: os.open(m / "x.md", os.O_CREAT | os.O_WRONLY),
        lambda m: os.unlink(m / "README.md"),
        lambda m: os.rename(m / "README.md", m / "y"),
        lambda m: os.mkdir(m / "d"),
        lambda m: os.utime(m / "README.md"),
    ],
)
def test_write_syscalls_get_errno_30(mounted, call):
    with pytest.raises(OSError) as raised:
        call(mounted)
    assert raised.value.errno == errno.EROFS == 30


def test_errnos_for_missing_notdir_and_isdir(mounted):
    with pytest.raises(FileNotFoundError):
        os.stat(mounted / "missing.md")
    with pytest.raises(FileNotFoundError):
        (mounted / "guide" / "missing").read_bytes()
    with pytest.raises(NotADirectoryError):
        os.stat(mounted / "README.md" / "x")
    with pytest.raises(IsADirectoryError):
        (mounted / "guide").read_bytes()
    done = run("cat", mounted / "guide", text=True)
    assert done.returncode == 1 and "Is a directory" in done.stderr


def test_reads_at_offsets_are_exact(mounted, fixture_src):
    data = (fixture_src / "large" / "big.txt").read_bytes()
    with open(mounted / "large" / "big.txt", "rb", buffering=0) as f:
        for offset, size in [(0, 1), ((1 << 20) - 3, 10), (4_999_990, 100), (5_000_000, 10)]:
            f.seek(offset)
            assert f.read(size) == data[offset : offset + size]


def test_statfs_and_xattrs(mounted, docs):
    done = run("stat", "-f", "-c", "%c %t", mounted, text=True, check=True)
    files, _ = done.stdout.split()
    tree_inodes = sum(1 for _ in docs.src.rglob("*")) + 1
    assert int(files) == tree_inodes
    # No extended attributes, and the kernel says so itself (ls -l asks two per file).
    for probe in (os.listxattr, lambda p: os.getxattr(p, "user.x")):
        with pytest.raises(OSError) as raised:
            probe(mounted / "README.md")
        assert raised.value.errno == errno.EOPNOTSUPP
    # The mount table names the index and the daemon's control socket.
    socket_path = record_path(mounted, ".sock")
    assert mountinfo.mount_at(mounted) == ("fuse.esfuse", f"esfuse:{docs.name}:{socket_path}")
    assert protocol.socket_of(mounted) == str(socket_path)
    with pytest.raises(OSError):
        protocol.socket_of(mounted / "guide")


def test_eight_concurrent_readers_for_thirty_seconds(mounted, fixture_src):
    seconds = float(os.environ.get("ESFUSE_STRESS_SECONDS", "30"))
    loop = (
        "end=$((SECONDS+{s})); n=0; while [ $SECONDS -lt $end ]; do {cmd} >/dev/null || exit 1; "
        "n=$((n+1)); done; echo $n"
    )
    commands = [
        "grep -r -c token {m}",
        "cat {m}/large/big.txt",
        "grep -rl OAuth {m}",
        "cat {m}/wide/page-0001.md {m}/assets/logo.png",
    ] * 2
    procs = [
        subprocess.Popen(
            ["bash", "-c", loop.format(s=int(seconds), cmd=c.format(m=mounted))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in commands
    ]
    for p in procs:
        out, err = p.communicate(timeout=seconds + 120)
        assert p.returncode == 0 and err == "", err
        assert int(out) > 0
    assert run("diff", "-r", mounted, fixture_src).returncode == 0


# -- the mount's life ---------------------------------------------------------------


def one_line_error(done, needle):
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr


def test_mounting_on_a_missing_dir_a_non_empty_dir_or_a_mount_fails(docs, mounted, tmp_path):
    one_line_error(docs.mount(tmp_path / "missing"), "does not exist")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    one_line_error(docs.mount(tmp_path / "full"), "is not empty")
    one_line_error(docs.mount(mounted), "already a mount point")


def test_mounting_an_index_with_nothing_published_fails_clearly(docs, tmp_path):
    (tmp_path / "m").mkdir()
    done = esfuse("mount", tmp_path / "m", "--es", docs.url, "--index", "never-ingested")
    one_line_error(done, "no published tree")
    assert run("mountpoint", "-q", tmp_path / "m").returncode != 0


def test_mounting_with_elasticsearch_unreachable_fails_clearly(tmp_path):
    (tmp_path / "m").mkdir()
    done = esfuse("mount", tmp_path / "m", "--es", "http://127.0.0.1:1", "--timeout", "1")
    one_line_error(done, "cannot reach Elasticsearch")


@pytest.mark.parametrize("command", ["mount", "ingest"])
def test_a_url_the_client_cannot_take_fails_clearly(tmp_path, command):
    (tmp_path / "m").mkdir()
    done = esfuse(command, tmp_path / "m", "--es", "localhost", "--index", "docs")
    one_line_error(done, "cannot use Elasticsearch at localhost")
    assert run("mountpoint", "-q", tmp_path / "m").returncode != 0


def test_a_corrupt_tree_document_refuses_the_mount(es_url, es, fixture_src, tmp_path):
    d = Docs(es_url, es, fixture_src / "guide", prefix="corrupt")
    try:
        assert d.ingest().returncode == 0
        pointer = es.get(index=f"{d.name}-meta", id="current")["_source"]
        es.index(
            index=f"{d.name}-meta",
            id=f"tree-{pointer['version']}-0",
            document={"data": "bm90IGd6aXA="},
            refresh=True,
        )
        (tmp_path / "m").mkdir()
        one_line_error(d.mount(tmp_path / "m"), "checksum")
    finally:
        d.drop()


def test_umount_waits_for_the_daemon_and_sigterm_unmounts(docs, tmp_path):
    mountpoint = mount_or_fail(docs, tmp_path / "m")
    record = read_record(mountpoint)
    assert record is not None
    pid = record["pid"]
    assert (mountpoint / "README.md").read_bytes() == (docs.src / "README.md").read_bytes()
    done = esfuse("umount", mountpoint)
    assert done.returncode == 0, done.stderr
    assert not alive(pid)  # exited: gone, or a zombie init has yet to reap
    assert run("mountpoint", "-q", mountpoint).returncode != 0
    one_line_error(esfuse("umount", mountpoint), "not an esfuse mount")

    mount_or_fail(docs, mountpoint)
    pid = read_record(mountpoint)["pid"]
    os.kill(pid, 15)
    deadline = time.monotonic() + 10
    while run("mountpoint", "-q", mountpoint).returncode == 0:
        assert time.monotonic() < deadline, "SIGTERM did not unmount"
        time.sleep(0.05)
    assert list(mountpoint.iterdir()) == []


def test_a_forced_unmount_ends_the_daemon(docs, tmp_path):
    # What unmounting does when a hand-over to the kernel waits on a read that no
    # one will answer any more.
    mountpoint = mount_or_fail(docs, tmp_path / "m")
    pid = read_record(mountpoint)["pid"]
    # An open file keeps a detached mount, and its connection, alive: only the
    # abort ends them.
    held = os.open(mountpoint / "guide", os.O_RDONLY)
    try:
        force_unmount(mountpoint)
        assert run("mountpoint", "-q", mountpoint).returncode != 0
        deadline = time.monotonic() + 10
        while alive(pid):
            assert time.monotonic() < deadline, "the daemon outlived its connection"
            time.sleep(0.05)
        # statfs always asks the daemon; a listing might come from the kernel's copy.
        with pytest.raises(OSError) as raised:
            os.fstatvfs(held)
        assert raised.value.errno == errno.ENOTCONN
    finally:
        os.close(held)
        unmount(mountpoint)


def test_foreground_mount_serves_until_sigint(docs, tmp_path):
    (tmp_path / "m").mkdir()
    proc = subprocess.Popen(
        [*ESFUSE, "mount", "-f", tmp_path / "m", "--es", docs.url, "--index", docs.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "m" / "README.md").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(2)
        assert proc.wait(timeout=15) == 0
        assert run("mountpoint", "-q", tmp_path / "m").returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            unmount(tmp_path / "m")


def test_the_mintlify_corpus_mounts_byte_exact(es_url, es, tmp_path_factory):
    src = corpus("mintlify-docs", tmp_path_factory)
    d = Docs(es_url, es, src, prefix="mintlify")
    mountpoint = tmp_path_factory.mktemp("mintlify-mnt") / "m"
    try:
        done = d.ingest()
        assert done.returncode == 0, done.stderr
        mount_or_fail(d, mountpoint)
        diff = run("diff", "-r", mountpoint, src)
        assert diff.returncode == 0 and diff.stdout == b"", diff.stdout[:2000]
        ours = run("grep", "-rn", "api", ".", cwd=mountpoint).stdout
        theirs = run("grep", "-rn", "api", ".", cwd=src).stdout
        assert sorted(ours.splitlines()) == sorted(theirs.splitlines())
    finally:
        unmount(mountpoint)
        d.drop()


def test_ls_a_shows_dot_entries_once(mounted):
    names = run("ls", "-a1", mounted / "wide", text=True, check=True).stdout.splitlines()
    assert names[:2] == [".", ".."] and len(names) == len(set(names)) == 5002


def test_a_backend_failure_is_eio_and_the_mount_keeps_serving(es_url, es, tmp_path):
    src = tmp_path / "src"
    for rel in ("x/one.md", "y/two.md"):
        (src / rel).parent.mkdir(parents=True)
        (src / rel).write_text(f"{rel}\n")
    d = Docs(es_url, es, src, prefix="eio")
    mountpoint = tmp_path / "m"
    try:
        assert d.ingest().returncode == 0
        mount_or_fail(d, mountpoint, "--no-preload")  # else two.md would be cached already
        assert (mountpoint / "x" / "one.md").read_text() == "x/one.md\n"
        es.indices.delete(index=f"{d.name}-chunks")
        with pytest.raises(OSError) as raised:
            (mountpoint / "y" / "two.md").read_bytes()
        assert raised.value.errno == errno.EIO
        assert (mountpoint / "x" / "one.md").read_text() == "x/one.md\n"
        assert sorted(os.listdir(mountpoint)) == ["x", "y"]
        log = record_path(mountpoint, ".log").read_text()
        assert "ERROR esfuse.fs: read /y/two.md: reading content" in log
    finally:
        unmount(mountpoint)
        d.drop()


def test_status_reports_the_tree_cache_and_requests(mounted, docs):
    (mounted / "guide" / "auth.md").read_bytes()
    done = esfuse("status", mounted, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["index"] == docs.name and answer["files"] > 5000
    assert answer["tree_version"] == 1 and answer["last_refresh_error"] is None
    assert answer["requests"]["content"] >= 1 and set(answer["latency_ms"]) == {"p50", "p90", "p99"}
    assert answer["pid"] == read_record(mounted)["pid"]
    assert answer["tree_load_ms"] > 0 and answer["rss_bytes"] > 10 << 20
    human = esfuse("status", mounted)
    assert human.returncode == 0 and f"index               {docs.name}" in human.stdout
    assert "hit rate" in human.stdout
    assert answer["preload"] in ("loading", "done")  # the fixture fits the cache
    assert re.search(
        r"^preload +(loading|done), \d+ files in the kernel, \d+ of them from local disk$",
        human.stdout,
        re.M,
    )
    one_line_error(esfuse("status", mounted.parent), "no esfuse daemon answers")


def test_a_mount_whose_daemon_was_killed_is_cleared_by_the_next_mount(docs, tmp_path):
    mountpoint = mount_or_fail(docs, tmp_path / "m")
    try:
        os.kill(read_record(mountpoint)["pid"], 9)
        deadline = time.monotonic() + 10
        while True:
            try:
                os.statvfs(mountpoint)
            except OSError as e:
                assert e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        done = docs.mount(mountpoint)
        assert done.returncode == 0, done.stderr
        assert "cleared a dead esfuse mount" in done.stderr
        assert (mountpoint / "README.md").read_bytes() == (docs.src / "README.md").read_bytes()
    finally:
        unmount(mountpoint)


def test_the_installed_pyfuse3_is_the_patched_build():
    # scripts/setup installs the build of scripts/build-pyfuse3; with stock pyfuse3
    # the mount still works, but a warm `grep -r` makes two requests per file and
    # lists every directory again, every request waits on the event loop, and the
    # preload takes the interpreter lock back after each file it hands the kernel.
    import pyfuse3

    assert getattr(pyfuse3, "READ_GETS_INODE_WITHOUT_OPEN", False)
    assert getattr(pyfuse3, "OPENDIR_TAKES_FILEINFO", False)
    assert getattr(pyfuse3, "TAKES_WAITING_REQUESTS", False)
    assert getattr(pyfuse3, "STORES_MANY", False)


def test_a_lone_read_reads_ahead_nothing_and_a_traversal_reads_ahead(docs, fixture_src, tmp_path):
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--no-preload")

    def content_requests() -> int:
        time.sleep(0.3)  # a read-ahead starts after the read that missed has returned
        return status(mountpoint)["requests"].get("content", 0)

    try:
        names = sorted(p.name for p in (fixture_src / "wide").iterdir())
        before = content_requests()
        # Opened by name, in a directory no one has listed: one file, one request.
        first = mountpoint / "wide" / names[0]
        assert first.read_bytes() == (fixture_src / "wide" / names[0]).read_bytes()
        assert content_requests() == before + 1
        # Listed, then read in order: the misses bring their siblings in bulk.
        assert sorted(os.listdir(mountpoint / "wide")) == names
        before = content_requests()
        read = names[100:400]
        for name in read:
            assert (mountpoint / "wide" / name).read_bytes()
        assert content_requests() - before < len(read) / 10
    finally:
        unmount(mountpoint)


def test_preload_fetches_in_bulk_and_hands_everything_to_the_kernel(docs, fixture_src, tmp_path):
    files = [p for p in fixture_src.rglob("*") if p.is_file()]
    by_digest = {hashlib.sha256(p.read_bytes()).hexdigest(): p.stat().st_size for p in files}
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--no-keep-contents")
    try:
        preloaded = wait_preloaded(mountpoint)
        assert preloaded["cache_bytes"] == sum(by_digest.values())
        assert 0 < preloaded["requests"]["content"] < len(by_digest) / 50  # in bulk
        assert preloaded["handed_to_kernel"] == sum(1 for p in files if p.stat().st_size)
        # Every byte, from the kernel's page cache: no read reached the daemon.
        assert run("diff", "-r", fixture_src, mountpoint).returncode == 0
        after = status(mountpoint)
        for key in ("requests", "cache_hits", "cache_misses"):
            assert after[key] == preloaded[key], key
    finally:
        unmount(mountpoint)


def test_a_later_mount_preloads_what_an_earlier_one_kept(docs, fixture_src, tmp_path, monkeypatch):
    monkeypatch.setenv("ESFUSE_CACHE_DIR", str(tmp_path / "cache"))
    packs = tmp_path / "cache" / "packs"
    files = [p for p in fixture_src.rglob("*") if p.is_file()]
    one_chunk = sum(1 for p in files if 0 < p.stat().st_size <= CHUNK_SIZE)
    assert one_chunk < len(files) - 1  # the fixture has large and empty files too
    sizes = {hashlib.sha256(p.read_bytes()).digest(): p.stat().st_size for p in files}
    large = sum(size for size in sizes.values() if size > CHUNK_SIZE)

    def preload(then=lambda: None) -> dict:
        mountpoint = mount_or_fail(docs, tmp_path / "m")
        try:
            preloaded = wait_preloaded(mountpoint)
            then()
            assert run("diff", "-r", fixture_src, mountpoint).returncode == 0
            # Every byte from the kernel's page cache: no read reached the daemon.
            assert status(mountpoint)["cache_misses"] == preloaded["cache_misses"]
            return preloaded
        finally:
            unmount(mountpoint)

    def kept() -> None:
        deadline = time.monotonic() + 30
        while not list(packs.glob("*.pack")):
            assert time.monotonic() < deadline, "no pack was written"
            time.sleep(0.1)

    first = preload(then=kept)
    assert first["from_local_disk"] == 0
    second = preload()
    # Every file of one chunk went from local disk to the kernel, without passing
    # through our cache; only the large ones came from Elasticsearch.
    assert second["from_local_disk"] == one_chunk
    assert second["handed_to_kernel"] == first["handed_to_kernel"]
    assert 0 < second["requests"]["content"] < first["requests"]["content"]
    assert second["cache_bytes"] == large < first["cache_bytes"]
    # A damaged pack is no pack: it costs fetches, never wrong bytes (diff -r above).
    (pack,) = packs.glob("*.pack")
    data = bytearray(pack.read_bytes())
    data[-1] ^= 0xFF
    pack.write_bytes(bytes(data))
    third = preload()
    assert third["from_local_disk"] == 0
    assert third["requests"]["content"] == first["requests"]["content"]


def test_the_kernel_is_handed_contents_only_if_their_pages_fit_the_cache(docs, tmp_path):
    # The fixture's 5.3 MB of contents fit half of 16 MB; in whole pages they are 25 MB.
    # (Kept on local disk, they would be read from there and not cached.)
    mountpoint = mount_or_fail(docs, tmp_path / "m", "--cache-size", "16M", "--no-keep-contents")
    try:
        answer = wait_preloaded(mountpoint)
        assert answer["handed_to_kernel"] == 0
        assert answer["cache_bytes"] > 5 << 20
    finally:
        unmount(mountpoint)
