"""Shared fixtures: a real Elasticsearch node, the edge-case tree, ingested, mounted.

The node comes from `scripts/es-dev start` (a no-op when it already runs), or
from ESFUSE_TEST_ES. Nothing here fakes Elasticsearch or FUSE.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from esfuse import protocol
from tests.fixture import make_fixture

REPO = Path(__file__).resolve().parent.parent
CORPORA = Path(os.environ.get("ESFUSE_CORPORA", REPO.parent / "shared" / "corpora"))
ESFUSE = [sys.executable, "-m", "esfuse"]


def run(*args, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("timeout", 600)
    return subprocess.run([str(a) for a in args], check=check, **kwargs)


def esfuse(*args, **kwargs) -> subprocess.CompletedProcess:
    return run(*ESFUSE, *args, text=True, **kwargs)


@pytest.fixture(scope="session", autouse=True)
def tree_cache(tmp_path_factory) -> None:
    """Mounts keep decoded trees in a directory of this session, not the machine's."""
    os.environ["ESFUSE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def es_url() -> str:
    url = os.environ.get("ESFUSE_TEST_ES")
    if url:
        return url
    done = run(REPO / "scripts" / "es-dev", "start", text=True, timeout=900)
    if done.returncode:
        pytest.fail(f"scripts/es-dev start failed: {done.stderr.strip()}", pytrace=False)
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def es(es_url):
    from elasticsearch import Elasticsearch

    client = Elasticsearch(es_url)
    yield client
    client.close()


class Docs:
    """A docs index made for one test session; its indices are deleted afterwards."""

    def __init__(self, es_url: str, es, src: Path, prefix: str = "test") -> None:
        self.url, self.es, self.src = es_url, es, src
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"

    def ingest(self, *extra, src: Path | None = None) -> subprocess.CompletedProcess:
        return esfuse("ingest", src or self.src, "--es", self.url, "--index", self.name, *extra)

    def mount(self, mountpoint: Path, *extra) -> subprocess.CompletedProcess:
        return esfuse("mount", mountpoint, "--es", self.url, "--index", self.name, *extra)

    def count(self, kind: str) -> int:
        self.es.indices.refresh(index=f"{self.name}-{kind}")
        return self.es.count(index=f"{self.name}-{kind}")["count"]

    def drop(self) -> None:
        # action.destructive_requires_name forbids wildcards in deletes.
        for kind in ("chunks", "files", "meta"):
            self.es.indices.delete(index=f"{self.name}-{kind}", ignore_unavailable=True)


@pytest.fixture(scope="session")
def fixture_src(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.mktemp("fixture") / "docs")


@pytest.fixture(scope="session")
def docs(es_url, es, fixture_src):
    d = Docs(es_url, es, fixture_src)
    done = d.ingest()
    assert done.returncode == 0, done.stderr
    yield d
    d.drop()


def mount_or_fail(docs: Docs, mountpoint: Path, *extra) -> Path:
    mountpoint.mkdir(parents=True, exist_ok=True)
    done = docs.mount(mountpoint, *extra)
    assert done.returncode == 0, done.stderr
    return mountpoint


def status(mountpoint: Path) -> dict:
    """The mount's daemon's status, asked through its control socket."""
    path = protocol.socket_of(mountpoint)
    answer = protocol.call(path, {"op": "status"}, 30)
    assert answer["ok"], answer
    return answer


def wait_preloaded(mountpoint: Path) -> dict:
    """The status once the preload of the last tree is done."""
    deadline = time.monotonic() + 60
    while (answer := status(mountpoint))["preload"] != "done":
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)
    return answer


def unmount(mountpoint: Path) -> None:
    done = esfuse("umount", mountpoint)
    if done.returncode:
        run("fusermount3", "-u", "-z", mountpoint)


@pytest.fixture(scope="session")
def mounted(docs, tmp_path_factory):
    mountpoint = mount_or_fail(docs, tmp_path_factory.mktemp("mnt") / "docs")
    yield mountpoint
    unmount(mountpoint)


def corpus(name: str, tmp_path_factory) -> Path:
    archive = CORPORA / f"{name}.tar.gz"
    if not archive.exists():
        pytest.skip(f"{archive} is not present")
    dest = tmp_path_factory.mktemp(name)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest
