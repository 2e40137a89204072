"""Which file systems are mounted where, read from /proc/self/mountinfo.

Reading the table never touches the mounts themselves, so a dead FUSE mount
("Transport endpoint is not connected") cannot make it hang or fail. Plain
strings and `os.path` only: esgrep imports this on every call, and pathlib
alone would cost it more than the rest of its start-up.
"""

from __future__ import annotations

import os
import re

FSTYPE = "fuse.esfuse"
_ESCAPE = re.compile(rb"\\([0-7]{3})")


def mounts() -> list[tuple[str, str, str]]:
    """(mountpoint, fstype, source) of every mount, in mount order."""
    found = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            after = fields.index(b"-")
            point, fstype, source = fields[4], fields[after + 1], fields[after + 2]
            found.append((_unescaped(point), fstype.decode(), _unescaped(source)))
    return found


def _unescaped(field: bytes) -> str:
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), field))


def mount_at(mountpoint: os.PathLike[str] | str) -> tuple[str, str] | None:
    """(fstype, source) of the file system mounted at `mountpoint` (the last one wins)."""
    wanted = os.path.abspath(mountpoint)
    found = [(fstype, source) for point, fstype, source in mounts() if point == wanted]
    return found[-1] if found else None


def fstype_at(mountpoint: os.PathLike[str] | str) -> str | None:
    """The type of the file system mounted at `mountpoint`, or None."""
    found = mount_at(mountpoint)
    return found[0] if found else None


def esfuse_mount_of(path: str, table: list[tuple[str, str, str]]) -> tuple[str, str] | None:
    """(mountpoint, source) of the esfuse mount in `table` (see `mounts`) that holds
    `path` (absolute, resolved), or None."""
    holder: tuple[str, str, str] | None = None
    for point, fstype, source in table:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # Deeper mounts shadow shallower ones; a later mount shadows an earlier one.
        if inside and (holder is None or len(point) >= len(holder[0])):
            holder = (point, fstype, source)
    return (holder[0], holder[2]) if holder is not None and holder[1] == FSTYPE else None
