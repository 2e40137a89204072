"""`esgrep`: GNU grep's interface, answered with the help of the mount's daemon.

esgrep reads grep's arguments, and when every file operand lies in one esfuse
mount, asks that mount's daemon to plan the search, find the candidate files in
Elasticsearch, prefetch them, and narrow what this process sees of the tree.
Then it becomes the real grep (exec, same pid, same arguments): output, errors
and exit status are grep's own. Anything esgrep cannot plan, and any path
outside an esfuse mount, goes straight to grep, so `alias grep=esgrep` is safe.
"""

from __future__ import annotations

import os
import sys

from esfuse import protocol
from esfuse.grep import options
from esfuse.mountinfo import esfuse_mount_of, mounts

TYPE_CHECKING = False  # not importing typing keeps esgrep's start-up short
if TYPE_CHECKING:
    from typing import NoReturn

TIMEOUT = 60.0


def real_grep() -> str:
    """GNU grep: $ESGREP_GREP, else the first `grep` on PATH that is not esgrep itself."""
    configured = os.environ.get("ESGREP_GREP")
    if configured:
        return configured
    me = os.path.realpath(sys.argv[0])
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", "grep")
        if os.access(candidate, os.X_OK) and os.path.realpath(candidate) != me:
            return candidate
    return "/usr/bin/grep"


def exec_grep(argv: list[str]) -> NoReturn:
    grep = real_grep()
    try:
        os.execv(grep, ["grep", *argv])
    except OSError as e:
        fail(f"cannot run {grep}: {e.strerror}")


def fail(message: str) -> NoReturn:
    print(f"esgrep: {message}", file=sys.stderr)
    sys.exit(2)


def locate(operands: list[str]) -> tuple[tuple[str, str], list[str]] | None:
    """The one esfuse mount holding every operand (mountpoint, source), and the
    operands relative to it."""
    table = mounts()  # read once: every operand is looked up in the same table
    mount: tuple[str, str] | None = None
    scopes = []
    for operand in operands:
        path = os.path.realpath(operand)
        holder = esfuse_mount_of(path, table)
        if holder is None or mount not in (None, holder):
            return None
        mount = holder
        relative = os.path.relpath(path, holder[0])
        scopes.append("" if relative == "." else relative)
    return (mount, scopes) if mount is not None else None


def prepare(found: tuple[str, str], scopes: list[str], call: options.GrepCall) -> None:
    """Ask the mount's daemon to plan, prefetch and narrow; exits 2 with a reason if it cannot."""
    mount, source = found
    socket_path = protocol.socket_in(source)
    if socket_path is None:
        fail(f"{mount}: cannot find its esfuse daemon; is it mounted by esfuse?")
    timeout = float(os.environ.get("ESGREP_TIMEOUT", TIMEOUT))
    request = {
        "op": "grep",
        "patterns": [os.fsdecode(p) for p in call.patterns],
        "dialect": call.dialect,
        "ignore_case": call.ignore_case,
        "every_file": call.every_file,
        "scopes": scopes,
    }
    try:
        response = protocol.call(socket_path, request, timeout)
    except TimeoutError:
        fail(f"{mount}: the esfuse daemon did not answer within {timeout:g} s (ESGREP_TIMEOUT)")
    except (OSError, protocol.ProtocolError) as e:
        fail(f"{mount}: cannot talk to its esfuse daemon ({e}); remount with `esfuse mount`")
    if not response.get("ok"):
        fail(f"{mount}: {response.get('error')}")


def main() -> NoReturn:
    argv = sys.argv[1:]
    call = options.parse(argv)
    if isinstance(call, options.GrepCall):
        target = locate(call.operands)
        if target is not None:
            prepare(*target, call)
    exec_grep(argv)
