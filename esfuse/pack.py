"""Packs: the preloaded contents of an index, kept on local disk for the next mount.

A preload fetches every content of a tree from Elasticsearch, about 24 MB of
base64 for tldr (38,405 files), which took 1.5-2.5 s on this project's machine;
a `grep -r` started at mount waits for it. When the preload is done, the daemon
writes the contents into one pack per index, and the next mount's preload
reads what it can from there first, which takes milliseconds.

A pack is content-addressed: it holds contents by their SHA-256, so it serves
any version of the tree that shares them. It is checked whole against the
checksum in its header when it is opened, so a damaged pack costs fetches,
never wrong bytes. It is then mapped into memory, and its contents go from
there to the kernel's page cache without a copy in Python (see preload). A pack
is only ever replaced whole, never changed in place: one cut short under the
mapping would end the daemon with SIGBUS. Only
contents of one chunk are kept (the files a traversal reads by the thousand);
larger ones come from Elasticsearch as ever. A viewer reads only the digests of
its own tree, which lists only what it may see. Packs live in a directory only
their owner can read, like trees.

Layout: a tag line; the SHA-256 of all that follows; the count N as 8 bytes; N
raw digests of 32 bytes; N + 1 offsets of 8 bytes into the data; the data.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
from array import array
from collections.abc import Iterable, Iterator, KeysView, Sequence
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
        with open(path, "rb") as f:
            self._read_index(f.fileno())
            # Mapped, not read: handed over from the file, libfuse read each
            # content into a fresh buffer before writing it to the kernel. Mapped,
            # the hand-over's thread spent 0.19 s on tldr instead of 0.25, and the
            # preload was done 0.64 s after mount-ready instead of 0.75 (medians
            # of 6 and 8 mounts). The mapping outlives the descriptor; the file is
            # only ever replaced whole (see Packs.write), never cut short under it.
            self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)

    def _read_index(self, fd: int) -> None:
        head = os.pread(fd, _HEAD, 0)
        if len(head) != _HEAD or head[: len(TAG)] != TAG:
            raise ValueError("not an esfuse pack")
        if _checksum(fd, _SUMMED) != head[len(TAG) : _SUMMED]:
            raise ValueError("its checksum does not match")
        count = int.from_bytes(head[_SUMMED:], "little")
        self._data_at = _HEAD + count * _DIGEST + (count + 1) * 8
        index = os.pread(fd, self._data_at - _HEAD, _HEAD)
        if len(index) != self._data_at - _HEAD:
            raise ValueError("truncated")
        self._offsets = array("Q")
        self._offsets.frombytes(index[count * _DIGEST :])
        if os.fstat(fd).st_size != self._data_at + self._offsets[-1]:
            raise ValueError("its size does not match its index")
        # One hex string, sliced: a hex() per digest took 55 ms for tldr's 38,000
        # contents, on the way to the first read and the first hand-over.
        digests, step = index[: count * _DIGEST].hex(), 2 * _DIGEST
        keys = (digests[i : i + step] for i in range(0, len(digests), step))
        self._where = dict(zip(keys, range(count), strict=True))

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, digest: object) -> bool:
        return digest in self._where

    def digests(self) -> KeysView[str]:
        return self._where.keys()

    def get(self, digest: str) -> memoryview | None:
        """The content with SHA-256 `digest`, if the pack holds it: a view of the
        mapped pack, no copy."""
        i = self._where.get(digest)
        if i is None:
            return None
        start = self._data_at + self._offsets[i]
        return memoryview(self._map)[start : start + self._offsets[i + 1] - self._offsets[i]]

    def close(self) -> None:
        """Unmap the pack; BufferError, and the pack still open, while a view
        from `get` is held."""
        self._map.close()


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

    def write(self, index: str, contents: Iterable[tuple[str, bytes | memoryview]]) -> None:
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
        life: views of its contents may be on their way to the kernel at any
        time, and a content-addressed pack stays right after a newer one
        replaced it."""
        if self._opened.is_set() or self._opening:
            return
        self._opening = True
        try:
            self.pack = await trio.to_thread.run_sync(self.packs.open, self.index)
        finally:
            self._opened.set()

    def get(self, digest: str, size: int) -> memoryview | None:
        """A content from the open pack, if it holds it (see Pack.get)."""
        if self.pack is None or not 0 < size <= self.chunk_size:
            return None
        return self.pack.get(digest)

    def lacking(self, tree: Tree) -> Iterator[tuple[str, int]]:
        """The contents of `tree` that the open pack does not hold, in the order
        of Tree.contents."""
        if self.pack is None:
            return tree.contents()
        # A pass over the digests first: walking the whole tree, as every mount
        # after the first would only to find that the pack holds everything, took
        # 96 ms of the thread that answers the kernel, as a `grep -r` at mount began.
        # What `get` serves is held; an empty content needs no load.
        sizes, held, chunk = tree.content_sizes(), self.pack.digests(), self.chunk_size
        wanted = {d for d, s in sizes.items() if s and not (s <= chunk and d in held)}
        return (c for c in tree.contents() if c[0] in wanted) if wanted else iter(())

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
                        found[key] = bytes(data)
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
        kept: dict[str, bytes | memoryview] = {}
        # Tree.contents gives each content once, none external.
        for n, (digest, size) in enumerate(tree.contents(), 1):
            if n % 1024 == 0:
                await trio.lowlevel.checkpoint()  # a walk over the whole tree
            if not 0 < size <= self.chunk_size:
                continue
            data = self.get(digest, size)
            if data is None:
                data = content.cached(digest, size, 0, size, count=False)
            if data is None:
                log.info("not keeping the contents: some are not cached")
                return False
            kept[digest] = data
        pack = self.pack
        if pack is not None and len(pack) == len(kept) and all(d in pack for d in kept):
            return False
        await trio.to_thread.run_sync(self.packs.write, self.index, list(kept.items()))
        log.info("kept %d contents on local disk", len(kept))
        return True
