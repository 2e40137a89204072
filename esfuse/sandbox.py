"""`esfuse sandbox`: run a command (a shell, an agent) that sees the docs and little else.

bubblewrap builds the sandbox: the mount read-only at /docs (the working
directory), the system's /usr read-only with the usual /bin, /lib and /sbin
links, a private /tmp, /proc and /dev, no network (a new network namespace has
only a loopback that is down), new pid, ipc and uts namespaces, no other host
path, and it dies with its parent. esgrep works inside: it needs only the
standard library and the esfuse package, which are bound read-only under
/opt/esfuse, and the mount's control socket, bound at its own path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import esfuse
from esfuse import daemon, protocol
from esfuse.access import Viewer
from esfuse.errors import EsfuseError
from esfuse.mountinfo import FSTYPE, fstype_at
from esfuse.store import Connection

DOCS = "/docs"
TOOLS = "/opt/esfuse"
LAUNCHER = f"""#!/usr/bin/python3 -I
import sys
sys.path.insert(0, "{TOOLS}")
from esfuse.grep.cli import main
main()
"""


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), f"/{name}"]
        elif top.is_dir():
            args += ["--ro-bind", str(top), f"/{name}"]
    for path in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def command_line(mountpoint: Path, launcher_fd: int, argv: list[str]) -> list[str]:
    """The bwrap command that runs `argv` over the mount at `mountpoint`."""
    socket_path = protocol.socket_of(mountpoint)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise EsfuseError("esfuse sandbox needs bubblewrap (apt-get install bubblewrap)")
    package = Path(esfuse.__file__).parent
    return [
        bwrap,
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        str(mountpoint),
        DOCS,
        "--ro-bind",
        str(package),
        f"{TOOLS}/esfuse",
        "--perms",
        "0755",
        "--ro-bind-data",
        str(launcher_fd),
        f"{TOOLS}/bin/esgrep",
        "--ro-bind",
        socket_path,
        socket_path,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        f"{TOOLS}/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        os.environ.get("LANG", "C.UTF-8"),
        "--setenv",
        "TERM",
        os.environ.get("TERM", "dumb"),
        "--chdir",
        DOCS,
        "--",
        *argv,
    ]


def run(mountpoint: Path, argv: list[str], view: tuple[Connection, Viewer] | None) -> NoReturn:
    """Run the sandboxed command; its exit status is ours.

    With `view`, the sandbox gets a private mount of the same index that sees
    what that viewer may see (say, one agent's groups), unmounted afterwards.
    """
    mountpoint = Path(os.path.abspath(mountpoint))
    if fstype_at(mountpoint) != FSTYPE:
        raise EsfuseError(f"{mountpoint} is not an esfuse mount")
    if not argv:
        raise EsfuseError("give a command to run in the sandbox, after --")
    if view is None:
        _exec(mountpoint, argv)
    record = daemon.read_record(mountpoint)
    if record is None:
        raise EsfuseError(f"{mountpoint}: its daemon's record is missing; remount it")
    connection, viewer = view
    with tempfile.TemporaryDirectory(prefix="esfuse-sandbox-") as tmp:
        private = Path(tmp) / "docs"
        private.mkdir()
        daemon.mount(
            daemon.MountOptions(
                mountpoint=private,
                connection=connection,
                index=record["index"],
                viewer=viewer,
                refresh=0,
            ),
            foreground=False,
        )
        try:
            status = subprocess.run(
                command_line(private, _launcher(), argv), pass_fds=_PASSED
            ).returncode
        finally:
            daemon.umount(private)
    sys.exit(status)


_PASSED: list[int] = []


def _launcher() -> int:
    """A pipe holding the esgrep launcher, for bwrap to copy in: no file left behind."""
    read_end, write_end = os.pipe()
    os.write(write_end, LAUNCHER.encode())
    os.close(write_end)
    os.set_inheritable(read_end, True)
    _PASSED.append(read_end)
    return read_end


def _exec(mountpoint: Path, argv: list[str]) -> NoReturn:
    args = command_line(mountpoint, _launcher(), argv)
    sys.stdout.flush()
    os.execv(args[0], args)
