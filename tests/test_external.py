"""External files: listed by a manifest, fetched on first read from http or file URLs."""

from __future__ import annotations

import errno
import functools
import json
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from esfuse.access import Rules
from esfuse.daemon import record_path
from esfuse.errors import EsfuseError
from esfuse.external import external_digest, load_manifest
from tests.conftest import Docs, mount_or_fail, run, unmount

ESGREP = str(Path(sys.executable).parent / "esgrep")


def test_manifests_are_checked(tmp_path):
    manifest = tmp_path / "m.json"
    for entries, message in [
        ({"path": "a"}, "JSON list"),
        ([["a"]], "must be an object"),
        ([{"path": "", "url": "file:///x", "size": 1}], "'path'"),
        ([{"path": "a", "url": "ftp://x/a", "size": 1}], "'url' must be http"),
        ([{"path": "a", "url": "s3://bucket/a", "size": 1}], "S3 support"),
        ([{"path": "a", "url": "file:///a", "size": -1}], "'size'"),
        ([{"path": "a", "url": "file:///a", "size": 1, "mtime": "yesterday"}], "'mtime'"),
    ]:
        manifest.write_text(json.dumps(entries))
        with pytest.raises(EsfuseError, match=message):
            load_manifest(manifest, Rules())
    manifest.write_text(
        json.dumps(
            [
                {
                    "path": "/api/x.json",
                    "url": "https://h/x.json",
                    "size": 3,
                    "mtime": "2024-01-02T03:04:05+00:00",
                }
            ]
        )
    )
    (record,) = load_manifest(manifest, Rules())
    assert (record.path, record.size, record.url) == ("api/x.json", 3, "https://h/x.json")
    assert record.mtime_ns == 1704164645 * 10**9
    assert record.digest == external_digest("https://h/x.json", 3, record.mtime_ns)
    assert external_digest("u", 3, 1) != external_digest("u", 3, 2)


class Recording(SimpleHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        Recording.paths.append(self.path)
        super().do_GET()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "spec.json").write_text('{"openapi": "3.1.0", "marker": "EXTERNAL-HTTP-MARK"}\n')
    (root / "liar.json").write_text("twenty bytes long..\n")
    Recording.paths = []
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Recording, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


def test_external_files_mount_and_read(es_url, es, tmp_path, served):
    base, www = served
    src = tmp_path / "src"
    (src / "api").mkdir(parents=True)
    (src / "api" / "guide.md").write_text("see the spec\n")
    local = tmp_path / "local.yaml"
    local.write_text("marker: EXTERNAL-FILE-MARK\n")
    spec = (www / "spec.json").read_bytes()
    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            [
                {
                    "path": "api/spec.json",
                    "url": f"{base}/spec.json",
                    "size": len(spec),
                    "mtime": 1e9,
                },
                {"path": "api/local.yaml", "url": local.as_uri(), "size": local.stat().st_size},
                {"path": "api/missing.json", "url": f"{base}/missing.json", "size": 10},
                {"path": "api/liar.json", "url": f"{base}/liar.json", "size": 5},
            ]
        )
    )
    d = Docs(es_url, es, src, prefix="external")
    mountpoint = tmp_path / "m"
    try:
        done = d.ingest("--manifest", manifest)
        assert done.returncode == 0, done.stderr
        mount_or_fail(d, mountpoint)
        assert Recording.paths == []  # nothing is fetched before it is read
        listing = run("ls", "-l", "--time-style=+%s", mountpoint / "api", text=True).stdout
        assert f"{len(spec)} 1000000000 spec.json" in listing
        assert (mountpoint / "api" / "spec.json").read_bytes() == spec
        assert (mountpoint / "api" / "local.yaml").read_bytes() == local.read_bytes()
        for name in ("missing.json", "liar.json"):
            with pytest.raises(OSError) as raised:
                (mountpoint / "api" / name).read_bytes()
            assert raised.value.errno == errno.EIO
        assert Recording.paths.count("/spec.json") == 1
        ours = run(ESGREP, "-r", "MARK", ".", cwd=mountpoint)
        theirs = run("grep", "-r", "MARK", ".", cwd=mountpoint)
        assert (ours.returncode, ours.stdout, ours.stderr) == (
            theirs.returncode,
            theirs.stdout,
            theirs.stderr,
        )
        assert b"EXTERNAL-HTTP-MARK" in ours.stdout and b"EXTERNAL-FILE-MARK" in ours.stdout
        assert b"Input/output error" in ours.stderr  # the failing ones, as grep reports them
        log = record_path(mountpoint, ".log").read_text()
        assert "read /api/liar.json: fetching" in log and "got 20 bytes, the manifest says 5" in log
    finally:
        unmount(mountpoint)
        d.drop()
