"""Which file systems are mounted where, read from /proc/self/mountinfo.

Reading the table never touches the mounts themselves, so a dead FUSE mount
("Transport endpoint is not connected") cannot make it hang or fail. Plain
bytes and `os.path` only, not `pathlib` or `re`: esgrep imports this on every
call, and either would cost it more than the rest of this module.
"""

from __future__ import annotations

import os

FSTYPE = "fuse.esfuse"
_OCTAL = frozenset(b"01234567")


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
    """The kernel writes a space, tab, newline or backslash in a field as \\ooo (octal)."""
    first, *rest = field.split(b"\\")
    parts = [first]
    for part in rest:
        code = part[:3]
        if len(code) == 3 and _OCTAL.issuperset(code):
            parts += [bytes([int(code, 8) & 0xFF]), part[3:]]
        else:
            parts += [b"\\", part]
    return os.fsdecode(b"".join(parts))


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
