"""`mount.fuse.esfuse`: the helper mount(8) runs for fstab lines of type fuse.esfuse.

    docs  /mnt/docs  fuse.esfuse  ro,_netdev,es=http://127.0.0.1:9200,groups=billing  0 0

mount(8) calls ``mount.fuse.esfuse SOURCE MOUNTPOINT -o OPTIONS``; the source is
the index name and the options are esfuse's (``es``, ``groups``, ``all``,
``config``, ``cache-size``, ``refresh``, ``timeout``, ``api-key-file``,
``ca-certs``, ``cloud-id``, ``allow_other``) plus the generic ones mount(8) and
fstab use, which are ignored. The helper becomes `esfuse mount`.
"""

from __future__ import annotations

import os
import sys

from esfuse.errors import EsfuseError

GENERIC = {
    "ro",
    "rw",
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "nofail",
    "_netdev",
    "noatime",
    "nodiratime",
    "relatime",
    "nosuid",
    "nodev",
    "noexec",
    "exec",
    "suid",
    "dev",
    "sync",
    "async",
    "ignore",
}
VALUED = {
    "es",
    "groups",
    "cache-size",
    "refresh",
    "timeout",
    "api-key-file",
    "ca-certs",
    "cloud-id",
    "log-file",
}
FLAGS = {"all": "--all", "allow_other": "--allow-other"}


def translate(argv: list[str]) -> list[str]:
    """The `esfuse` arguments for a helper call."""
    positional: list[str] = []
    options: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "-o":
            if not rest:
                raise EsfuseError("-o needs a value")
            options += rest.pop(0).split(",")
        elif arg in ("-s", "-f", "-n", "-v"):
            continue  # sloppy, fake, no-mtab, verbose: nothing to do for esfuse
        elif arg.startswith("-"):
            raise EsfuseError(f"unsupported mount helper option {arg}")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise EsfuseError("usage: mount.fuse.esfuse INDEX MOUNTPOINT [-o OPTIONS]")
    index, mountpoint = positional
    front: list[str] = []
    args = ["mount", mountpoint, "--index", index]
    for option in filter(None, options):
        key, eq, value = option.partition("=")
        if key in GENERIC or key.startswith("x-"):
            continue
        if key == "config" and eq:
            front += ["--config", value]
        elif key in VALUED and eq:
            args += [f"--{key}", value]
        elif key in FLAGS and not eq:
            args.append(FLAGS[key])
        else:
            raise EsfuseError(f"unknown esfuse mount option {option!r}")
    return front + args


def main() -> None:
    try:
        args = translate(sys.argv[1:])
    except EsfuseError as e:
        print(f"mount.fuse.esfuse: {e}", file=sys.stderr)
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "esfuse", *args])
