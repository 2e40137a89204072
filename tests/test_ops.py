"""Running it for real: the systemd unit, readiness, unmounting, surviving a cluster outage."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from elasticsearch import Elasticsearch

from esfuse.daemon import alive
from esfuse.errors import EsfuseError
from esfuse.mounthelper import translate
from tests.conftest import ESFUSE, REPO, Docs, mount_or_fail, run, unmount


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_the_systemd_unit_verifies_clean(tmp_path):
    esfuse = Path(ESFUSE[0]).parent / "esfuse"
    unit = (REPO / "systemd" / "esfuse@.service").read_text()
    assert "Type=notify" in unit and "ExecReload=/bin/kill -HUP $MAINPID" in unit
    copy = tmp_path / "esfuse@.service"
    copy.write_text(unit.replace("/usr/local/bin/esfuse", str(esfuse)))
    done = run("systemd-analyze", "verify", copy, text=True)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr


def test_a_foreground_mount_notifies_systemd_once_it_answers(docs, tmp_path):
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(60)
        proc = subprocess.Popen(
            [*ESFUSE, "mount", "-f", mountpoint, "--es", docs.url, "--index", docs.name],
            env={**os.environ, "NOTIFY_SOCKET": address},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert listener.recv(64) == b"READY=1"
            assert "README.md" in os.listdir(mountpoint)  # ready means the mount answers
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                unmount(mountpoint)


@pytest.fixture
def own_node(tmp_path):
    """A second, private Elasticsearch node this test may stop and start."""
    es_dev = REPO / "scripts" / "es-dev"
    port, data = "9251", tmp_path / "es-data"

    def start() -> str:
        done = run(es_dev, "start", "--port", port, "--data", data, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def stop() -> None:
        assert run(es_dev, "stop", "--port", port).returncode == 0

    yield start, stop
    stop()


def test_surviving_elasticsearch_going_away_and_coming_back(own_node, tmp_path):
    start, stop = own_node
    url = start()
    src = tmp_path / "src"
    for rel in ("cached/one.md", "uncached/two.md"):
        (src / rel).parent.mkdir(parents=True)
        (src / rel).write_text(f"{rel} token\n")
    with Elasticsearch(url) as client:
        d = Docs(url, client, src, prefix="faults")
        assert d.ingest().returncode == 0
    # No preload: "uncached" must stay so until the node is gone.
    mountpoint = mount_or_fail(d, tmp_path / "m", "--timeout", "2", "--no-preload")
    try:
        assert (mountpoint / "cached" / "one.md").read_text() == "cached/one.md token\n"
        stop()
        assert (mountpoint / "cached" / "one.md").read_text() == "cached/one.md token\n"
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            (mountpoint / "uncached" / "two.md").read_bytes()
        assert raised.value.errno == errno.EIO and time.monotonic() - started < 15
        done = run(Path(ESFUSE[0]).parent / "esgrep", "-r", "token", mountpoint, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1
        assert "cannot reach Elasticsearch" in done.stderr
        start()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert (mountpoint / "uncached" / "two.md").read_text() == "uncached/two.md token\n"
                break
            except OSError:
                assert time.monotonic() < deadline, "reads did not come back"
                time.sleep(0.5)
    finally:
        unmount(mountpoint)


def test_mount_helper_options_become_esfuse_arguments():
    assert translate(
        ["docs", "/mnt/docs", "-o", "ro,_netdev,es=http://h:1,groups=a,all", "-n"]
    ) == ["mount", "/mnt/docs", "--index", "docs", "--es", "http://h:1", "--groups", "a", "--all"]
    assert translate(["d", "/m", "-o", "config=/etc/e.toml,refresh=5,x-systemd.automount"]) == [
        "--config",
        "/etc/e.toml",
        "mount",
        "/m",
        "--index",
        "d",
        "--refresh",
        "5",
    ]
    for bad in (["d", "/m", "-o", "frobnicate=1"], ["d"], ["d", "/m", "-Q"], ["d", "/m", "-o"]):
        with pytest.raises(EsfuseError):
            translate(bad)


@pytest.mark.skipif(
    not Path("/usr/sbin/mount.fuse.esfuse").exists(),
    reason="scripts/setup installs the fstab helper (as root)",
)
def test_an_fstab_line_mounts_with_mount_a(docs, tmp_path):
    mountpoint = tmp_path / "m"
    mountpoint.mkdir()
    fstab = tmp_path / "fstab"
    fstab.write_text(
        f"{docs.name} {mountpoint} fuse.esfuse ro,_netdev,es={docs.url},refresh=0 0 0\n"
    )
    done = run("mount", "-a", "-T", fstab, text=True)
    try:
        assert done.returncode == 0, done.stderr
        assert (mountpoint / "README.md").read_bytes() == (docs.src / "README.md").read_bytes()
        assert "fuse.esfuse" in run("findmnt", "-n", "-o", "FSTYPE", mountpoint, text=True).stdout
    finally:
        unmount(mountpoint)


def test_the_dockerfile_lints_clean_and_installs_what_setup_installs():
    hadolint = Path(ESFUSE[0]).parent / "hadolint"
    done = run(hadolint, REPO / "Dockerfile", text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    dockerfile = (REPO / "Dockerfile").read_text()
    setup = (REPO / "scripts" / "setup").read_text()
    for package in re.findall(r"\b([a-z0-9.+-]+)=[0-9:.+~-]+", dockerfile):
        assert re.search(rf"\b{re.escape(package)}\b", setup.split("packages=(")[1].split(")")[0])
    assert "pip install" in dockerfile and "pip install" in setup


def test_a_process_that_exited_counts_as_gone_before_it_is_reaped():
    # `sleep 0.1` exits as the child of a `sleep 30`, which never reaps it.
    parent = subprocess.Popen(
        ["sh", "-c", "sleep 0.1 & echo $!; exec sleep 30"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        zombie = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while b") Z " not in Path(f"/proc/{zombie}/stat").read_bytes():
            assert time.monotonic() < deadline, "sleep 0.1 did not exit"
            time.sleep(0.05)
        assert not alive(zombie)
        assert alive(parent.pid)
    finally:
        parent.kill()
        parent.wait()
    assert not alive(parent.pid)
