"""Live freshness: follow the published tree without remounting.

Every `interval` seconds, and at once when woken (SIGHUP), the refresher reads
the pointer; a new version is loaded, pruned for the mount's viewer, built on
the current tree (so unchanged paths keep their inodes), swapped in for every
user of the tree, and the kernel is told what changed. A tree that cannot be
loaded (unreachable cluster, corrupt or incompatible document) is logged and
the mount keeps its last good tree.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from esfuse.access import Viewer
from esfuse.errors import EsfuseError
from esfuse.store import Store
from esfuse.tree import Changes, Tree, changes, decode, visible

log = logging.getLogger(__name__)


class TreeUser(Protocol):
    def swap(self, tree: Tree) -> None: ...


class Refresher:
    def __init__(
        self,
        store: Store,
        viewer: Viewer,
        version: int,
        tree: Tree,
        users: list[TreeUser],
        notify: Callable[[Changes], Awaitable[None]],
        interval: float,
    ) -> None:
        self.store = store
        self.viewer = viewer
        self.version = version
        self.tree = tree
        self.users = users
        self.notify = notify
        self.interval = interval
        self.loaded_at = time.time()
        self.load_ms = 0.0  # how long fetching, decoding and building the tree took
        self.last_error: str | None = None
        self._wake = trio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self.interval if self.interval > 0 else float("inf")):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.check()

    async def check(self) -> bool:
        """Load and swap in a newer published tree; True if the tree changed."""
        try:
            pointer = await self.store.pointer()
            if pointer is None or pointer.version == self.version:
                return False
            started = time.monotonic()
            _, blob = await self.store.tree_document(pointer)
            new = Tree(*visible(*decode(blob), self.viewer), previous=self.tree)
            self.load_ms = (time.monotonic() - started) * 1000
        except EsfuseError as e:
            self.last_error = str(e)
            log.error("refresh failed, keeping tree version %d: %s", self.version, e)
            return False
        gc.freeze()  # as at mount (see daemon.serve): the collector need not walk it
        diff = changes(self.tree, new)
        for user in self.users:
            user.swap(new)
        self.tree, self.version, self.loaded_at = new, pointer.version, time.time()
        self.last_error = None
        await self.notify(diff)
        log.info(
            "tree version %d: %d gone, %d added, %d changed",
            pointer.version,
            len(diff.gone),
            len(diff.added),
            len(diff.touched),
        )
        return True
