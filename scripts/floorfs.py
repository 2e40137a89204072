"""The floor of esfuse's architecture: a minimal pyfuse3 file system serving a local tree from RAM.

    python scripts/floorfs.py SOURCE MOUNTPOINT [--patched [--hand-over]]

Everything is read into memory before the mount, and each request is answered
with no more work than a dictionary lookup, so its timings are what pyfuse3,
trio and the kernel cost by themselves. The benchmark runs it beside esfuse,
with opens (what stock pyfuse3 allows), and without opens and with listings
kept by the kernel (what esfuse's build of pyfuse3 allows). With --hand-over it
also does at mount what esfuse's preload does with nothing left to fetch: list
every directory through the mount with find(1), so that the kernel makes every
inode, then hand every content to the kernel's page cache in batches; that is
the floor of a `grep -r` started right at mount-ready. It prints "ready" once
mounted and serves until unmounted.
"""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pyfuse3
import trio

TIMEOUT = 300.0


class FloorFS(pyfuse3.Operations):
    def __init__(self, source: Path, patched: bool) -> None:
        super().__init__()
        self.patched = patched
        self.attrs: dict[int, pyfuse3.EntryAttributes] = {}
        self.children: dict[int, dict[bytes, int]] = {}
        self.listings: dict[int, list[tuple[bytes, int]]] = {}
        self.data: dict[int, bytes] = {}
        self.next_inode = pyfuse3.ROOT_INODE + 1
        self._load(pyfuse3.ROOT_INODE, source)

    def _load(self, inode: int, path: Path) -> None:
        st = path.stat()
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(inode)
        attr.st_mode = pyfuse3.ModeT(st.st_mode & ~0o222)
        attr.st_nlink = st.st_nlink
        attr.st_mtime_ns = st.st_mtime_ns
        attr.entry_timeout = attr.attr_timeout = TIMEOUT
        self.attrs[inode] = attr
        if not path.is_dir():
            self.data[inode] = path.read_bytes()
            attr.st_size = len(self.data[inode])
            return
        children = self.children[inode] = {}
        for entry in sorted(os.listdir(path)):
            children[os.fsencode(entry)] = self.next_inode
            self.next_inode += 1
        self.listings[inode] = list(children.items())
        for name, child in self.listings[inode]:
            self._load(child, path / os.fsdecode(name))

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        inode = self.children.get(parent_inode, {}).get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self.attrs[inode]

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        return self.attrs[inode]

    async def opendir(self, inode: int, ctx: Any) -> Any:
        if self.patched:
            return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(inode), cache_readdir=True)
        return pyfuse3.FileHandleT(inode)

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        listing = self.listings[fh]
        for i in range(start_id, len(listing)):
            name, inode = listing[i]
            if not pyfuse3.readdir_reply(token, name, self.attrs[inode], i + 1):
                break

    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        if self.patched:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(inode), keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return self.data[fh][off : off + size]

    async def release(self, fh: int) -> None:
        return None


def hand_over(ops: FloorFS, mountpoint: Path) -> None:
    """In a thread: list everything through the mount, then store every content."""
    subprocess.run(["find", os.fspath(mountpoint), "-false"], check=False)
    contents = [(inode, data) for inode, data in ops.data.items() if data]
    for start in range(0, len(contents), 256):
        pyfuse3.notify_store_many(contents[start : start + 256])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument(
        "--patched",
        action="store_true",
        help="use what esfuse's build of pyfuse3 allows: no opens, listings kept by the kernel",
    )
    parser.add_argument(
        "--hand-over",
        action="store_true",
        help="at mount, list everything and hand every content to the kernel (with --patched)",
    )
    args = parser.parse_args()
    if args.patched and not getattr(pyfuse3, "OPENDIR_TAKES_FILEINFO", False):
        raise SystemExit("floorfs: --patched needs the pyfuse3 of scripts/build-pyfuse3")
    if args.hand_over and not args.patched:
        raise SystemExit("floorfs: --hand-over needs --patched")
    ops = FloorFS(args.source, args.patched)
    options = set(pyfuse3.default_options) | {"ro", "fsname=floorfs"}
    pyfuse3.init(ops, str(args.mountpoint), options)
    print("ready", flush=True)
    if args.hand_over:
        threading.Thread(target=hand_over, args=(ops, args.mountpoint), daemon=True).start()
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


if __name__ == "__main__":
    main()
