"""Freshness: a running mount follows re-ingests, without mixing versions."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from esfuse.daemon import read_record
from esfuse.tree import DirRecord, FileRecord, Tree, changes
from tests.conftest import Docs, mount_or_fail, status, unmount, wait_preloaded

# -- pure units ---------------------------------------------------------------------


def test_unchanged_paths_keep_their_inodes_and_changed_content_gets_a_new_one():
    old = Tree(
        [DirRecord("", 1), DirRecord("d", 1)],
        [
            FileRecord("d/a.md", 1, 1, "A"),
            FileRecord("d/b.md", 1, 1, "B"),
            FileRecord("gone.md", 1, 1, "G"),
        ],
    )
    new = Tree(
        [DirRecord("", 2), DirRecord("d", 1)],
        [
            FileRecord("d/a.md", 1, 5, "A"),
            FileRecord("d/b.md", 2, 1, "B2"),
            FileRecord("new.md", 1, 1, "N"),
        ],
        previous=old,
    )
    assert new.resolve("d") == old.resolve("d")
    assert new.resolve("d/a.md") == old.resolve("d/a.md")
    assert new.resolve("d/b.md") > old.inode_count + 0  # never a number the old tree used
    assert new.resolve("new.md") not in {old.resolve(p) for p in ("gone.md", "d/b.md")}
    with pytest.raises(KeyError):
        new.node(old.resolve("gone.md"))
    with pytest.raises(KeyError):
        new.node(old.resolve("d/b.md"))
    assert new.inode_count == 5  # root, d, a, b, new
    diff = changes(old, new)
    d = old.resolve("d")
    assert sorted(diff.gone) == sorted(
        [(1, b"gone.md", old.resolve("gone.md")), (d, b"b.md", old.resolve("d/b.md"))]
    )
    assert sorted(diff.added) == sorted([(1, b"new.md"), (d, b"b.md")])
    assert sorted(diff.touched) == sorted([1, old.resolve("d/a.md")])  # mtimes changed


def test_a_file_that_becomes_a_directory_is_a_new_inode():
    old = Tree([], [FileRecord("x", 1, 1, "X")])
    new = Tree([], [FileRecord("x/y", 1, 1, "Y")], previous=old)
    assert new.resolve("x") != old.resolve("x") and new.is_dir(new.resolve("x"))
    assert not changes(new, new)


# -- against Elasticsearch and real mounts ---------------------------------------------


def wait_for(check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def live(es_url, es, tmp_path):
    src = tmp_path / "src"
    (src / "dir").mkdir(parents=True)
    (src / "a.md").write_text("version one\n")
    (src / "dir" / "keep.md").write_text("kept\n")
    (src / "dir" / "doomed.md").write_text("doomed\n")
    (src / "quiet").mkdir()
    (src / "quiet" / "old.md").write_text("old\n")
    d = Docs(es_url, es, src, prefix="live")
    assert d.ingest().returncode == 0
    yield d, src, tmp_path / "m"
    unmount(tmp_path / "m")
    d.drop()


def test_a_mount_shows_a_new_version_within_the_refresh_interval(live):
    d, src, m = live
    mount_or_fail(d, m, "--refresh", "0.5")
    assert (m / "a.md").read_text() == "version one\n"
    assert sorted(os.listdir(m)) == ["a.md", "dir", "quiet"]
    assert sorted(os.listdir(m / "dir")) == ["doomed.md", "keep.md"]
    assert os.listdir(m / "quiet") == ["old.md"]
    with pytest.raises(FileNotFoundError):
        (m / "b.md").stat()  # a cached miss must not hide b.md later
    (src / "a.md").write_text("version two, longer\n")
    (src / "b.md").write_text("bee\n")
    (src / "dir" / "doomed.md").unlink()
    quiet = (src / "quiet").stat()
    (src / "quiet" / "unseen.md").write_text("never looked up before\n")
    # The directory's attributes stay as they were: only its listing changes.
    os.utime(src / "quiet", ns=(quiet.st_atime_ns, quiet.st_mtime_ns))
    assert d.ingest().returncode == 0
    wait_for(lambda: (m / "a.md").read_text() == "version two, longer\n")
    assert (m / "a.md").stat().st_size == len("version two, longer\n")
    assert (m / "b.md").read_text() == "bee\n"
    # Listings the kernel kept (opendir asks it to) are dropped by the refresh, also
    # where no name the kernel knew of changed (quiet/unseen.md).
    assert sorted(os.listdir(m)) == ["a.md", "b.md", "dir", "quiet"]
    assert sorted(os.listdir(m / "dir")) == ["keep.md"]
    assert sorted(os.listdir(m / "quiet")) == ["old.md", "unseen.md"]
    with pytest.raises(FileNotFoundError):
        (m / "dir" / "doomed.md").stat()
    assert status(m)["tree_version"] == 2


def test_sighup_refreshes_at_once_and_open_handles_keep_their_version(live):
    d, src, m = live
    mount_or_fail(d, m, "--refresh", "0")
    old = open(m / "a.md", "rb", buffering=0)  # noqa: SIM115
    assert old.read(3) == b"ver"
    (src / "a.md").write_text("VERSION TWO\n")
    assert d.ingest().returncode == 0
    time.sleep(0.5)
    assert (m / "a.md").read_text() == "version one\n"  # refresh 0: only on SIGHUP
    os.kill(read_record(m)["pid"], signal.SIGHUP)
    wait_for(lambda: (m / "a.md").read_text() == "VERSION TWO\n", 5)
    assert old.read() == b"sion one\n"
    old.close()


def test_a_refresh_hands_what_it_adds_to_the_kernel(live):
    d, src, m = live
    mount_or_fail(d, m, "--refresh", "0")
    wait_preloaded(m)
    assert status(m)["handed_to_kernel"] == 4
    (src / "a.md").write_text("version two\n")
    (src / "quiet" / "new.md").write_text("new\n")
    # A new inode whose content the cache holds already: nothing to load for it.
    (src / "quiet" / "old.md").rename(src / "quiet" / "moved.md")
    assert d.ingest().returncode == 0
    os.kill(read_record(m)["pid"], signal.SIGHUP)
    wait_for(lambda: status(m)["tree_version"] == 2)
    before = wait_preloaded(m)
    assert before["handed_to_kernel"] == 4 + 3  # and nothing that stayed the same
    assert (m / "a.md").read_text() == "version two\n"
    assert (m / "quiet" / "new.md").read_text() == "new\n"
    assert (m / "quiet" / "moved.md").read_text() == "old\n"
    # All read from the kernel's page cache: no read reached the daemon.
    after = status(m)
    assert (after["cache_hits"], after["cache_misses"]) == (
        before["cache_hits"],
        before["cache_misses"],
    )


def test_readers_never_see_a_mix_of_two_versions(live):
    d, src, m = live
    versions = [b"A" * 70_000 + b"\n", b"b" * 1_500_000 + b"\n"]  # different sizes, 1 and 2 chunks
    (src / "a.md").write_bytes(versions[0])
    assert d.ingest().returncode == 0
    mount_or_fail(d, m, "--refresh", "0.2")
    stop = src.parent / "stop"
    reader = subprocess.Popen(
        ["bash", "-c", f"until [ -e {stop} ]; do cat {m}/a.md | md5sum; done"],
        stdout=subprocess.PIPE,
        text=True,
    )
    grepper = subprocess.Popen(
        ["bash", "-c", f"until [ -e {stop} ]; do grep -rc b {m} || [ $? = 1 ] || exit 9; done"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for n in range(6):
        (src / "a.md").write_bytes(versions[(n + 1) % 2])
        assert d.ingest().returncode == 0
        time.sleep(0.5)
    stop.touch()
    out, _ = reader.communicate(timeout=120)
    _, errors = grepper.communicate(timeout=120)
    assert grepper.returncode == 0 and errors == "", errors
    allowed = {hashlib.md5(v).hexdigest() for v in versions}
    seen = {line.split()[0] for line in out.splitlines()}
    assert seen <= allowed and len(seen) == 2, seen


def test_a_corrupt_new_tree_keeps_the_last_good_one(live, es):
    d, _src, m = live
    mount_or_fail(d, m, "--refresh", "0.2")
    pointer = es.get(index=f"{d.name}-meta", id="current")["_source"]
    es.index(
        index=f"{d.name}-meta",
        id="current",
        refresh=True,
        document={**pointer, "version": pointer["version"] + 1},
    )  # its parts do not exist
    wait_for(lambda: status(m)["last_refresh_error"] is not None, 5)
    assert "missing" in status(m)["last_refresh_error"]
    assert status(m)["tree_version"] == pointer["version"]
    assert (m / "a.md").read_text() == "version one\n"
