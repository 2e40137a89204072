"""Preloading a mounted tree: every content into our cache, and on into the kernel's.

When a tree's contents fit in half the content cache, the daemon loads them all
in the background after mount, and after each refresh (the cache keeps what is
unchanged, so only what is new is loaded). In our cache, a first `grep -r` still
costs one READ round trip per file, about 45 µs: over tldr (38,405 files) even
the RAM floor took 1.6-1.9 s, seven times a warm run. So each loaded batch also
goes to the kernel's page cache with notify_store (a few µs a file, from a
thread that takes the interpreter lock once per 64 files), where reads find it
without asking us. Done 2.0-2.6 s after mount on tldr, a first `grep -r` then
took 0.20-0.25 s, as a warm one, with no read reaching the daemon.

The kernel takes pages only for inodes it knows, and learns of inodes only from
lookups and listings (FUSE has no notification that adds one). So find(1) lists
every directory through the mount, and each directory is handed over once the
kernel has read it to its end, by find or by anyone else: a `grep -r` started
right at mount finds the files of the directory it lists being handed over as
it reads them, as fast as the contents arrive. The kernel keeps each file in
whole pages, so it is handed the contents only when those pages fit in the cache
budget too: a million files of 100 bytes fit half of a 256 MB cache, and would
take 4 GB of page cache.

The hand-over follows the tree in traversal order, behind the preload and the
listing, and takes whatever the pack or the cache holds: also what reads and
esgrep fetched first, and what a refresh finds cached already under a new
inode. A failure here is logged and ends the hand-over, never the mount.
"""

from __future__ import annotations

import logging
import mmap
import os
import subprocess
from pathlib import Path

import trio

from esfuse.cache import ContentCache
from esfuse.fs import Stored, hand_to_kernel
from esfuse.grep.service import Served
from esfuse.pack import Keeper
from esfuse.tree import Tree

log = logging.getLogger(__name__)

# Files per hand-over to the thread: few trips through trio, quick to stop.
HAND_OVER_BATCH = 256


class _Progress:
    """Wakes the hand-over at each step of the preload or of the listing, and at its end."""

    def __init__(self) -> None:
        self.finished = False
        self._next = trio.Event()

    def step(self) -> None:
        self._next.set()
        self._next = trio.Event()

    def finish(self) -> None:
        self.finished = True
        self.step()

    async def wait(self) -> None:
        """Until the next step, or not at all once finished: a waiter may have
        awaited something else when the last step came."""
        if not self.finished:
            await self._next.wait()


class Preload:
    """Loads every content of each new tree into the cache and the kernel, when all fit."""

    def __init__(
        self,
        content: ContentCache,
        nursery: trio.Nursery,
        mountpoint: Path,
        served: Served,
        keeper: Keeper | None = None,
    ) -> None:
        self.content = content
        self.keeper = keeper
        self.nursery = nursery
        self.mountpoint = mountpoint
        self.served = served
        self.state = "loading"  # then "done", or "too large" for the cache
        self.pushed = 0  # files handed to the kernel since mount
        self.from_pack = 0  # of which from the pack on local disk
        # A byte per inode the kernel holds (handed over, or read). Kept across
        # refreshes: an inode's content never changes, and a new tree numbers what
        # changed anew.
        self._held = bytearray()
        self._tree: Tree | None = None  # swapped in, not started yet
        self._trees = 0  # the last swap's number: an older tree's hand-over stops
        self._refused = 0  # the tree whose contents the kernel refused
        self._stopping = False
        self._handing = trio.Lock()
        # A byte per directory of the tree swapped in last that the kernel has read
        # to its end, and so knows the inodes of; `_listing` wakes the hand-over.
        self._listed = bytearray()
        self._listing = _Progress()

    def swap(self, tree: Tree) -> None:
        """Take `tree` with the other users of the tree, so that `state` never
        speaks of the one before; `start` begins on it."""
        self._trees += 1
        self._held.extend(bytes(max(0, tree.slots - len(self._held))))
        self._tree = tree
        self._listed = bytearray(tree.slots)
        self.state = "loading" if self.content.can_preload(tree.total_size) else "too large"

    def start(self) -> None:
        """Begin on the tree swapped in last, once the kernel has forgotten what
        changed: the hand-over lists directories for it to learn the new inodes,
        and a name it dropped after that would take its inode with it."""
        tree, self._tree = self._tree, None
        if tree is None:
            return
        if self.state == "too large":
            log.info("contents (%d bytes) exceed half the cache: not preloading", tree.total_size)
            return
        log.info("preloading %d files", tree.file_count)
        self.nursery.start_soon(self._run, tree, self._trees)

    def listed(self, directory: int) -> None:
        """The kernel has read `directory` to its end (see fs.Operations.readdir)."""
        if directory < len(self._listed) and not self._listed[directory]:
            self._listed[directory] = 1
            self._listing.step()

    async def stop(self, timeout: float) -> bool:
        """Hand the kernel nothing more; whether, within `timeout` seconds, no
        hand-over is under way any more.

        A hand-over may wait for the lock of a page that a read in flight holds,
        which only our answer releases; the thread checks `_stopping` between steps
        of a few dozen files (see fs.hand_to_kernel).
        """
        self._stopping = True
        with trio.move_on_after(timeout):
            async with self._handing:
                return True
        return False

    async def _run(self, tree: Tree, number: int) -> None:
        progress = _Progress()
        pages = tree.pages(mmap.PAGESIZE)
        fetched = self.keeper.fetched if self.keeper else 0
        try:
            async with trio.open_nursery() as nursery:
                opened = trio.Event()  # the pack: the listing need not wait for it
                if pages * mmap.PAGESIZE <= self.content.chunks.max_bytes:
                    nursery.start_soon(self._hand_over, tree, number, progress, opened)
                else:
                    log.info("%d pages exceed the cache: not handing them to the kernel", pages)
                try:
                    if self.keeper:
                        await self.keeper.open()
                    opened.set()
                    # What the pack holds goes to the kernel from there, and to a
                    # read from there too: our cache need not hold it.
                    lacking = self.keeper.lacking(tree) if self.keeper else tree.contents()
                    await self.content.preload(lacking, progress.step)
                finally:
                    opened.set()
                    progress.finish()
        except Exception:
            log.exception("preloading tree %d failed", number)  # the mount serves on
        if number != self._trees:
            return
        self.state = "done"
        # A pack that held every content the preload wanted is left as it is.
        if (
            self.keeper
            and not self._stopping
            and (self.keeper.pack is None or self.keeper.fetched > fetched)
        ):
            try:
                await self.keeper.keep(tree, self.content)
            except Exception:
                log.exception("keeping the contents of tree %d failed", number)

    def _current(self, number: int) -> bool:
        return number == self._trees != self._refused and not self._stopping

    async def _hand_over(
        self, tree: Tree, number: int, progress: _Progress, opened: trio.Event
    ) -> None:
        # Its own boundary: a failure here must not cancel the preload, whose
        # readers would then fail too.
        try:
            async with trio.open_nursery() as nursery:
                listing = self._listing = _Progress()
                nursery.start_soon(self._list_all, listing)
                await opened.wait()
                handed = await self._hand_over_listed(tree, number, progress, listing)
                nursery.cancel_scope.cancel()  # stopped before the listing ended
            log.info("handed %d files of tree %d to the kernel", handed, number)
        except Exception:
            log.exception("handing tree %d to the kernel failed", number)

    async def _hand_over_listed(
        self, tree: Tree, number: int, progress: _Progress, listing: _Progress
    ) -> int:
        handed = 0
        batch: list[Stored] = []
        for n, inode in enumerate(tree.file_inodes(), 1):
            if not self._current(number):
                return handed
            if n % HAND_OVER_BATCH == 0:
                await trio.lowlevel.checkpoint()  # a walk over what the kernel holds
            if self._held[inode] or self.served.given(inode):
                # Handed over for an earlier tree, or read: the kernel holds it.
                self._held[inode] = 1
                self.served.mark(inode)
                continue
            digest, size = tree.content(inode)
            if digest is None or not size:
                continue
            parent = tree.parent(inode)
            while self._current(number) and not (listing.finished or self._listed[parent]):
                handed += await self._hand(batch, number)  # what is ready, meanwhile
                await listing.wait()
            # From the pack if it holds it, else from our cache.
            data = self.content.cached(digest, size, 0, size, count=False)
            # Not cached yet: wait for the preload, unless it could not load it (a
            # read will ask for it then).
            while data is None and not (progress.finished or digest in tree.externals):
                handed += await self._hand(batch, number)  # what is ready, meanwhile
                await progress.wait()
                data = self.content.cached(digest, size, 0, size, count=False)
            if data is not None:
                batch.append((inode, data))
            if len(batch) >= HAND_OVER_BATCH:
                handed += await self._hand(batch, number)
        return handed + await self._hand(batch, number)

    async def _hand(self, batch: list[Stored], number: int) -> int:
        """Hand `batch` over and empty it; how many files the kernel took."""
        if not batch or not self._current(number):
            batch.clear()
            return 0
        async with self._handing:
            taken, refused = await trio.to_thread.run_sync(
                hand_to_kernel, list(batch), lambda: self._stopping
            )
        # From the pack, a view of its mapping; from our cache, bytes.
        packed = {inode for inode, data in batch if isinstance(data, memoryview)}
        batch.clear()
        for inode in taken:
            self._held[inode] = 1
            self.served.mark(inode)
        self.pushed += len(taken)
        self.from_pack += sum(1 for inode in taken if inode in packed)
        if refused:
            self._refused = number
        return len(taken)

    async def _list_all(self, listing: _Progress) -> None:
        """List every directory through the mount, so that the kernel makes every
        inode; `listing` finishes at the end, whether or not all could be listed
        (the kernel refuses contents only for an inode it does not know)."""
        # find(1), not os.scandir in a thread: the thread took the interpreter lock
        # back after each entry, and waited for it while this thread answered the
        # requests the listing made. On the RAM floor, a `grep -r` started at mount
        # took 0.64-1.33 s so, and 0.43-0.59 s with find listing.
        try:
            await trio.run_process(
                ["find", os.fspath(self.mountpoint), "-false"],
                stdout=subprocess.DEVNULL,
                capture_stderr=True,
            )
        except subprocess.CalledProcessError as e:
            reason = e.stderr.decode(errors="replace").strip().partition("\n")[0]
            log.warning("listing %s failed: %s", self.mountpoint, reason or e)
        except OSError as e:
            log.warning("cannot list %s: %s", self.mountpoint, e)
        finally:
            listing.finish()
