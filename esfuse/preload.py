"""Preloading a mounted tree: every content into our cache, and on into the kernel's.

When a tree's contents fit in half the content cache, the daemon loads them all
in the background after mount, and after each refresh (the cache keeps what is
unchanged, so only what is new is loaded). In our cache, a first `grep -r` still
costs one READ round trip per file, about 45 µs: over tldr (38,405 files) even
the RAM floor took 1.6-1.9 s, seven times a warm run. So each loaded batch also
goes to the kernel's page cache with notify_store (about 20 µs a file, from a
thread), where reads find it without asking us: after that, the first `grep -r`
over tldr took 0.18-0.23 s through the floor, as a warm one.

The kernel takes pages only for inodes it knows, and learns of inodes only from
lookups and listings (FUSE has no notification that adds one). So a thread first
lists every directory through the mount; the kernel keeps those listings too.
The kernel keeps each file in whole pages, so it is handed the contents only
when those pages fit in the cache budget too: a million files of 100 bytes fit
half of a 256 MB cache, and would take 4 GB of page cache.
"""

from __future__ import annotations

import errno
import logging
import math
import mmap
import os
from pathlib import Path

import pyfuse3
import trio

from esfuse.cache import ContentCache, Key
from esfuse.grep.service import Served
from esfuse.tree import Tree

log = logging.getLogger(__name__)

Push = list[tuple[int, bytes]]
Files = dict[str, tuple[int, list[int]]]  # digest -> (size, inodes)


class Preload:
    """Loads every content of each new tree into the cache and the kernel, when all fit."""

    def __init__(
        self, content: ContentCache, nursery: trio.Nursery, mountpoint: Path, served: Served
    ) -> None:
        self.content = content
        self.nursery = nursery
        self.mountpoint = mountpoint
        self.served = served
        self.state = "loading"  # then "done", or "too large" for the cache
        self.pushed = 0  # files handed to the kernel
        self._trees = 0  # the last swap's number: only its end is "done"
        self._kernel_takes = True  # until the kernel or the mount refuses
        self._stopping = False
        self._pushing = trio.Lock()

    def swap(self, tree: Tree) -> None:
        self._trees += 1
        if not self.content.can_preload(tree.total_size):
            log.info("contents (%d bytes) exceed half the cache: not preloading", tree.total_size)
            self.state = "too large"
            return
        log.info("preloading %d files", tree.file_count)
        self.state = "loading"
        self.nursery.start_soon(self._run, tree, self._trees)

    async def stop(self) -> None:
        """Hand the kernel nothing more; returns once no hand-over is under way.

        Called while requests are still served: a hand-over waits for the lock
        of a page that a read in flight holds, which only our answer releases.
        """
        self._stopping = True
        async with self._pushing:
            pass

    async def _run(self, tree: Tree, number: int) -> None:
        files, pages = _inodes_by_content(tree)
        if pages * mmap.PAGESIZE > self.content.chunks.max_bytes:
            log.info("%d pages exceed the cache: not handing contents to the kernel", pages)
            await self.content.preload(tree.contents())
        else:
            await self._load_and_hand_over(tree, files)
        if number == self._trees:
            self.state = "done"
        log.info("preloaded; %d files handed to the kernel", self.pushed)

    async def _load_and_hand_over(self, tree: Tree, files: Files) -> None:
        send, receive = trio.open_memory_channel[Push](math.inf)

        def loaded(keys: list[Key]) -> None:
            push: Push = []
            for digest in {digest for digest, _ in keys}:
                size, inodes = files[digest]
                # None while another chunk of a large file is still on its way.
                data = self.content.whole(digest, size)
                if data is not None:
                    push.extend((inode, data) for inode in inodes)
            send.send_nowait(push)

        listed = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._list_all, listed)
            nursery.start_soon(self._hand_over, listed, receive)
            async with send:
                await self.content.preload(tree.contents(), loaded)

    async def _list_all(self, listed: trio.Event) -> None:
        try:
            count = await trio.to_thread.run_sync(
                _list_directories, self.mountpoint, abandon_on_cancel=True
            )
            log.debug("listed %d directories for the kernel", count)
        except OSError as e:
            log.warning("cannot list %s; handing the kernel nothing: %s", self.mountpoint, e)
            self._kernel_takes = False
        listed.set()

    async def _hand_over(
        self, listed: trio.Event, receive: trio.MemoryReceiveChannel[Push]
    ) -> None:
        await listed.wait()
        async with receive:
            async for push in receive:
                if not self._kernel_takes or self._stopping:
                    continue  # drained, so the preload never waits on us
                # What the kernel has read meanwhile, it holds already.
                push = [(inode, data) for inode, data in push if not self.served.given(inode)]
                async with self._pushing:
                    taken = await trio.to_thread.run_sync(self._store, push)
                for inode in taken:
                    self.served.mark(inode)
                self.pushed += len(taken)

    def _store(self, push: Push) -> list[int]:
        """In a thread: the inodes whose contents the kernel took."""
        taken = []
        for inode, data in push:
            if self._stopping:
                break
            try:
                pyfuse3.notify_store(pyfuse3.InodeT(inode), 0, data)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue  # the kernel has let the inode go; a read will ask for it
                log.warning("the kernel refused contents (%s): handing over no more", e)
                self._kernel_takes = False
                break
            taken.append(inode)
        return taken


def _inodes_by_content(tree: Tree) -> tuple[Files, int]:
    """The files by content, and how many pages the kernel would keep them in."""
    files: Files = {}
    pages = 0
    for inode in tree.file_inodes():
        digest, size = tree.content(inode)
        if digest is not None:
            files.setdefault(digest, (size, []))[1].append(inode)
            pages += -(-size // mmap.PAGESIZE)
    return files, pages


def _list_directories(top: Path) -> int:
    """List every directory at or below `top`; how many there were."""
    stack, count = [os.fspath(top)], 0
    while stack:
        with os.scandir(stack.pop()) as entries:
            stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        count += 1
    return count
