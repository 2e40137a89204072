"""esfuse sandbox: a command that sees the docs and nothing else of the host."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import REPO, esfuse

pytestmark = [
    pytest.mark.mount,
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed"),
]


def inside(mounted, script: str):
    return esfuse("sandbox", mounted, "--", "bash", "-c", script)


def test_the_docs_and_the_usual_tools_work_inside(mounted, fixture_src):
    done = inside(
        mounted,
        "pwd && ls /docs && cat /docs/README.md && find /docs -name deep.md"
        " && grep -rn OAuth /docs && esgrep -rn OAuth /docs",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "/docs" and "README.md" in lines
    assert (fixture_src / "README.md").read_text() in done.stdout
    assert "/docs/a/b/c/d/e/f/deep.md" in lines
    hits = [line for line in lines if line.startswith("/docs/guide/quickstart.mdx:")]
    assert len(hits) == 2 and hits[0] == hits[1]  # grep and esgrep agree


def test_the_host_is_out_of_sight(mounted):
    for path in ("/etc/shadow", str(REPO), "/root", "/work", "/home"):
        assert inside(mounted, f"test ! -e {path}").returncode == 0, path
    done = inside(mounted, "touch /docs/x")
    assert done.returncode != 0 and "Read-only file system" in done.stderr
    net = inside(mounted, "exec 3<>/dev/tcp/127.0.0.1/9200")
    assert net.returncode != 0


def test_the_exit_status_passes_through(mounted):
    assert inside(mounted, "exit 7").returncode == 7


def test_a_path_that_is_not_a_mount_is_refused(tmp_path):
    done = esfuse("sandbox", tmp_path, "--", "true")
    assert done.returncode == 1 and "is not an esfuse mount" in done.stderr
