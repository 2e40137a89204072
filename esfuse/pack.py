"""Packs: the preloaded contents of an index, kept on local disk for the next mount.

A preload fetches every content of a tree from Elasticsearch, about 24 MB of
base64 for tldr (38,405 files), which took 1.5-2.5 s on this project's machine;
a `grep -r` started at mount waits for it. When the preload is done, the daemon
writes the contents into one pack per index, and the next mount's preload
reads what it can from there first, which takes milliseconds.

A pack is content-addressed: it holds contents by their SHA-256, so it serves
any version of the tree that shares them. It is checked whole against the
checksum in its header when it is opened, so a damaged pack costs fetches,
never wrong bytes; after that, contents go from it to the kernel's page cache
without passing through Python (see preload). Only contents of one chunk are
kept (the files a traversal reads by the thousand); larger ones come from
Elasticsearch as ever. A viewer reads only the digests of its own tree, which
lists only what it may see. Packs live in a directory only their owner can
read, like trees.

Layout: a tag line; the SHA-256 of all that follows; the count N as 8 bytes; N
raw digests of 32 bytes; N + 1 offsets of 8 bytes into the data; the data.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

from esfuse.cache import ContentCache, Key, Loader
from esfuse.tree import Tree
from esfuse.treecache import index_key

log = logging.getLogger(__name__)

TAG = b"esfuse-pack-1\n"
_DIGEST = 32
_COUNT = 8
_SUMMED = len(TAG) + _DIGEST  # where what the checksum covers begins
_HEAD = _SUMMED + _COUNT
_BLOCK = 1 << 20


class Pack:
    """One pack, open for reading."""

    def __init__(self, path: Path) -> None:
        """Open `path`; OSError or ValueError if it cannot be read as a pack."""
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._where = self._read_index()
        except BaseException:
            os.close(self.fd)
            raise

    def _read_index(self) -> dict[str, tuple[int, int]]:
        head = os.pread(self.fd, _HEAD, 0)
        if len(head) != _HEAD or head[: len(TAG)] != TAG:
            raise ValueError("not an esfuse pack")
        if _checksum(self.fd, _SUMMED) != head[len(TAG) : _SUMMED]:
            raise ValueError("its checksum does not match")
        count = int.from_bytes(head[_SUMMED:], "little")
        data_at = _HEAD + count * _DIGEST + (count + 1) * 8
        index = os.pread(self.fd, data_at - _HEAD, _HEAD)
        if len(index) != data_at - _HEAD:
            raise ValueError("truncated")
        offsets = array("Q")
        offsets.frombytes(index[count * _DIGEST :])
        if os.fstat(self.fd).st_size != data_at + offsets[-1]:
            raise ValueError("its size does not match its index")
        digests = index[: count * _DIGEST]
        return {
            digests[i * _DIGEST : (i + 1) * _DIGEST].hex(): (
                data_at + offsets[i],
                offsets[i + 1] - offsets[i],
            )
            for i in range(count)
        }

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, digest: object) -> bool:
        return digest in self._where

    def where(self, digest: str) -> tuple[int, int] | None:
        """Where the content with SHA-256 `digest` is: (offset, size) in `fd`."""
        return self._where.get(digest)

    def get(self, digest: str) -> bytes | None:
        """The content with SHA-256 `digest`, if the pack holds it."""
        where = self._where.get(digest)
        if where is None:
            return None
        offset, size = where
        try:
            data = os.pread(self.fd, size, offset)
        except OSError as e:
            log.warning("cannot read the pack: %s", e)
            return None
        return data if len(data) == size else None

    def close(self) -> None:
        os.close(self.fd)


def _checksum(fd: int, start: int) -> bytes:
    """The SHA-256 of what `fd` holds from `start` on."""
    # hashlib and pread release the interpreter lock for blocks this large.
    checksum = hashlib.sha256()
    offset = start
    while block := os.pread(fd, _BLOCK, offset):
        checksum.update(block)
        offset += len(block)
    return checksum.digest()


class Packs:
    """The packs in one directory, one per index."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, index: str) -> Path:
        return self.directory / f"{index_key(index)}.pack"

    def open(self, index: str) -> Pack | None:
        """The pack of `index`, or None if there is none or it cannot be read."""
        path = self._path(index)
        try:
            return Pack(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring the pack %s: %s", path, e)
            return None

    def write(self, index: str, contents: Iterable[tuple[str, bytes]]) -> None:
        """Make `contents` (digest, data) the pack of `index`; a failure is a warning."""
        digests, offsets, data = bytearray(), array("Q", [0]), []
        for digest, content in contents:
            digests += bytes.fromhex(digest)
            offsets.append(offsets[-1] + len(content))
            data.append(content)
        path = self._path(index)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(tmp, "w+b") as f:
                f.write(TAG + bytes(_DIGEST) + (len(offsets) - 1).to_bytes(_COUNT, "little"))
                f.write(digests)
                f.write(offsets.tobytes())
                f.writelines(data)
                f.flush()
                f.seek(len(TAG))
                f.write(_checksum(f.fileno(), _SUMMED))
            tmp.replace(path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("cannot keep the contents in %s: %s", self.directory, e)


class Keeper:
    """The pack of one index for a mount: read before Elasticsearch, and
    rewritten when a preload has loaded a tree it does not match."""

    def __init__(self, packs: Packs, index: str, chunk_size: int) -> None:
        self.packs = packs
        self.index = index
        self.chunk_size = chunk_size
        self.pack: Pack | None = None
        # Reads wait for an open under way: checking the pack takes tens of
        # milliseconds, a request to Elasticsearch no less, and the read-ahead
        # it would start loads a whole directory from there.
        self._opening = False
        self._opened = trio.Event()
        self.fetched = 0  # chunks the loader asked the backend for

    async def open(self) -> None:
        """Open the pack, the first time only. It then stays open for the mount's
        life: contents may be on their way from its `fd` to the kernel at any
        time, and a content-addressed pack stays right after a newer one
        replaced it."""
        if self._opened.is_set() or self._opening:
            return
        self._opening = True
        try:
            self.pack = await trio.to_thread.run_sync(self.packs.open, self.index)
        finally:
            self._opened.set()

    def where(self, digest: str, size: int) -> tuple[int, int, int] | None:
        """(fd, offset, size) of a content in the open pack, if it holds it."""
        if self.pack is None or not 0 < size <= self.chunk_size:
            return None
        where = self.pack.where(digest)
        return None if where is None else (self.pack.fd, *where)

    def holds(self, digest: str, size: int) -> bool:
        """Whether a read of this content would find it in the open pack."""
        return self.where(digest, size) is not None

    def loader(self, fetch: Loader) -> Loader:
        """`fetch`, asked only for what the open pack does not hold."""

        async def load(keys: Sequence[Key]) -> dict[Key, bytes]:
            if self._opening:
                await self._opened.wait()
            found: dict[Key, bytes] = {}
            for key in keys:
                # Only contents of one chunk are in a pack (see the module).
                if self.pack is not None and key[1] == 0:
                    data = self.pack.get(key[0])
                    if data is not None:
                        found[key] = data
            rest = [key for key in keys if key not in found]
            self.fetched += len(rest)
            if rest:
                found.update(await fetch(rest))
            return found

        return load

    async def keep(self, tree: Tree, content: ContentCache) -> bool:
        """Make the pack hold the one-chunk contents of `tree`, taken from the open
        pack and from `content`; whether it wrote a new one. Writes nothing if
        the open pack holds just those, or if any is missing."""
        pack = self.pack
        kept: dict[str, bytes | None] = {}  # None: in the open pack
        for n, (digest, size) in enumerate(tree.contents(), 1):
            if n % 1024 == 0:
                await trio.lowlevel.checkpoint()  # a walk over the whole tree
            if not 0 < size <= self.chunk_size or digest in kept or digest in tree.externals:
                continue
            if pack is not None and digest in pack:
                kept[digest] = None
                continue
            kept[digest] = content.cached(digest, size, 0, size, count=False)
            if kept[digest] is None:
                log.info("not keeping the contents: some are not cached")
                return False
        if pack is not None and len(pack) == len(kept) and all(d is None for d in kept.values()):
            return False
        contents = []
        for digest, data in kept.items():
            if data is None:
                assert pack is not None
                data = pack.get(digest)
                if data is None:
                    return False
            contents.append((digest, data))
        await trio.to_thread.run_sync(self.packs.write, self.index, contents)
        log.info("kept %d contents on local disk", len(contents))
        return True
