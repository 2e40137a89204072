"""Running it for real: the systemd unit, readiness notification."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ESFUSE, REPO, run, unmount


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
