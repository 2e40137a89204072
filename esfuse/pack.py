"""Packs: the preloaded contents of an index, kept on local disk for the next mount.

A preload fetches every content of a tree from Elasticsearch, about 24 MB of
base64 for tldr (38,405 files), which took 1.5-2.5 s on this project's machine;
a `grep -r` started at mount waits for it. When the preload is done, the daemon
writes the contents into one pack per index, and the next mount's preload
reads what it can from there first, which takes milliseconds.

A pack is content-addressed: it holds contents by their SHA-256, so it serves
any version of the tree that shares them, and every content read from it is
checked against its digest, so a damaged or foreign pack can only cost a fetch,
never give wrong bytes. Only contents of one chunk are kept (the files a
traversal reads by the thousand); larger ones come from Elasticsearch as ever.
A viewer reads only the digests of its own tree, which lists only what it may
see. Packs live in a directory only their owner can read, like trees.

Layout: a tag line, the count N as 8 bytes, N raw digests of 32 bytes, N + 1
offsets of 8 bytes into the data, then the data.
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

log = logging.getLogger(__name__)

TAG = b"esfuse-pack-1\n"
_DIGEST = 32
_COUNT = 8


class Pack:
    """One pack, open for reading."""

    def __init__(self, path: Path) -> None:
        """Open `path`; OSError or ValueError if it cannot be read as a pack."""
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._where = self._read_index()
        except BaseException:
            os.close(self._fd)
            raise

    def _read_index(self) -> dict[str, tuple[int, int]]:
        head = os.pread(self._fd, len(TAG) + _COUNT, 0)
        if head[: len(TAG)] != TAG or len(head) != len(TAG) + _COUNT:
            raise ValueError("not an esfuse pack")
        count = int.from_bytes(head[len(TAG) :], "little")
        digests_at = len(head)
        offsets_at = digests_at + count * _DIGEST
        data_at = offsets_at + (count + 1) * 8
        index = os.pread(self._fd, data_at - digests_at, digests_at)
        if len(index) != data_at - digests_at:
            raise ValueError("truncated")
        offsets = array("Q")
        offsets.frombytes(index[count * _DIGEST :])
        if offsets.itemsize != 8 or os.fstat(self._fd).st_size != data_at + offsets[-1]:
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

    def get(self, digest: str) -> bytes | None:
        """The content with SHA-256 `digest`, if the pack holds it intact."""
        where = self._where.get(digest)
        if where is None:
            return None
        offset, size = where
        try:
            data = os.pread(self._fd, size, offset)
        except OSError as e:
            log.warning("cannot read the pack: %s", e)
            return None
        if hashlib.sha256(data).hexdigest() != digest:
            log.warning("the pack's copy of %s is damaged; fetching it", digest)
            del self._where[digest]
            return None
        return data

    def close(self) -> None:
        os.close(self._fd)


class Packs:
    """The packs in one directory, one per index."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, index: str) -> Path:
        # A digest, not the name: the name comes from the command line.
        return self.directory / f"{hashlib.sha256(index.encode()).hexdigest()[:16]}.pack"

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
            with open(tmp, "wb") as f:
                f.write(TAG + (len(offsets) - 1).to_bytes(_COUNT, "little"))
                f.write(digests)
                f.write(offsets.tobytes())
                f.writelines(data)
            tmp.replace(path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("cannot keep the contents in %s: %s", self.directory, e)


class Keeper:
    """The pack of one index for a mount: read before Elasticsearch while it is
    open, and rewritten when a preload has loaded a tree it does not match."""

    def __init__(self, packs: Packs, index: str, chunk_size: int) -> None:
        self.packs = packs
        self.index = index
        self.chunk_size = chunk_size
        self.pack: Pack | None = None
        self.hits = 0

    async def open(self) -> None:
        self.close()
        self.pack = await trio.to_thread.run_sync(self.packs.open, self.index)

    def close(self) -> None:
        if self.pack is not None:
            self.pack.close()
            self.pack = None

    def loader(self, fetch: Loader) -> Loader:
        """`fetch`, asked only for what the open pack does not hold."""

        async def load(keys: Sequence[Key]) -> dict[Key, bytes]:
            pack = self.pack
            if pack is None:
                return await fetch(keys)
            found: dict[Key, bytes] = {}
            rest = []
            for key in keys:
                data = pack.get(key[0]) if key[1] == 0 else None
                if data is None:
                    rest.append(key)
                else:
                    found[key] = data
            self.hits += len(found)
            if rest:
                found.update(await fetch(rest))
            return found

        return load

    async def keep(self, tree: Tree, content: ContentCache) -> None:
        """Write what `content` holds of `tree` as the pack, unless the open pack
        holds just that; then close it. Keeps the old pack if a content is missing."""
        kept: dict[str, bytes] = {}
        for n, (digest, size) in enumerate(tree.contents(), 1):
            if n % 1024 == 0:
                await trio.lowlevel.checkpoint()  # a walk over the whole tree
            if not 0 < size <= self.chunk_size or digest in kept or digest in tree.externals:
                continue
            data = content.cached(digest, size, 0, size, count=False)
            if data is None:
                log.info("not keeping the contents: some are not cached")
                self.close()
                return
            kept[digest] = data
        pack, self.pack = self.pack, None
        if pack is not None:
            pack.close()
            if len(pack) == len(kept) and all(digest in pack for digest in kept):
                return
        await trio.to_thread.run_sync(self.packs.write, self.index, list(kept.items()))
        log.info("kept %d contents on local disk", len(kept))
