"""The daemon's side of esgrep: plan, search, prefetch, and narrow what grep sees.

For a grep call the daemon (1) plans a coarse query from the patterns, (2) asks
Elasticsearch which files under the requested scopes can match, (3) loads those
files into the content cache in a few bulk requests, and (4) registers a
*session* for the caller's process: while it lives, directories it opens list
only candidate files (and the directories leading to them). esgrep then runs
the real grep with the caller's arguments in that same process, so the output
is grep's own, and grep merely skips files that cannot match.

When files without a match may print something (-v, -L, -c) or the plan is
ALL, there is no session: grep sees everything, prefetched as far as the cache
allows.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import trio

from esfuse.cache import ContentCache
from esfuse.errors import TreeError
from esfuse.protocol import ProtocolError
from esfuse.store import TEXT_LIMIT, Store
from esfuse.tree import ROOT, Tree, split_path

log = logging.getLogger(__name__)

MAX_PATTERNS = 10_000
MAX_SCOPES = 1_000
MAX_SESSIONS = 256
# Above this share of the tree's files matching, a search stops narrowing and grep
# reads everything: listing the hits costs some 20-40 us each (Elasticsearch
# fetching them, decoding, narrowed listings), and reading a file about 5 us when
# the kernel holds it, 60-100 us when it must ask for it (tldr, warm: esgrep -r the
# narrowed to 7,026 files took 0.20-0.28 s, grep -r over all 38,405 0.17-0.24 s).
UNSELECTIVE = 0.5
UNSELECTIVE_WARM = 0.1
# The share of the tree the kernel must have been given for it to count as warm.
WARM = 0.9


class Sessions:
    """Process id → the inodes its directory listings may show."""

    def __init__(self) -> None:
        self._visible: dict[int, frozenset[int]] = {}

    def visible(self, pid: int) -> frozenset[int] | None:
        return self._visible.get(pid)

    def add(self, pid: int, inodes: frozenset[int]) -> None:
        if len(self._visible) >= MAX_SESSIONS and pid not in self._visible:
            # The oldest session gives way: its grep then sees every file (still correct).
            self._visible.pop(next(iter(self._visible)))
        self._visible[pid] = inodes

    def remove(self, pid: int, inodes: frozenset[int]) -> None:
        if self._visible.get(pid) is inodes:
            del self._visible[pid]


class Served:
    """How much of the tree the kernel has been given since the tree was loaded.

    The kernel keeps what it reads (see fs: no opens, keep_cache), so this
    estimates what its page cache holds, which decides whether grep reading
    everything would be served from memory or would ask for every file.
    """

    def __init__(self, tree: Tree) -> None:
        self.swap(tree)

    def swap(self, tree: Tree) -> None:
        # A new version starts cold: an underestimate only keeps searches narrowed.
        self._seen = bytearray(tree.slots)
        self._files = tree.file_count
        self._count = 0

    def given(self, inode: int) -> bool:
        """Whether the kernel has been given this inode's content."""
        return inode < len(self._seen) and bool(self._seen[inode])

    def mark(self, inode: int) -> None:
        if inode < len(self._seen) and not self._seen[inode]:
            self._seen[inode] = 1
            self._count += 1

    @property
    def share(self) -> float:
        return self._count / self._files if self._files else 1.0


def _strings(value: object, what: str, limit: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{what} must be a list of strings")
    if len(value) > limit:
        raise ProtocolError(f"too many {what} ({len(value)} > {limit})")
    return value


def scope_inodes(tree: Tree, scopes: list[str]) -> list[int]:
    """Inodes of the scopes that exist; a scope may not leave the mount."""
    inodes = []
    for scope in scopes:
        relative = scope.strip("/")
        try:
            split_path(relative)
        except TreeError:
            raise ProtocolError(f"scope {scope!r} is outside the mount") from None
        inode = tree.resolve(relative)
        if inode is not None:
            inodes.append(inode)
    return inodes


def _under(tree: Tree, inode: int, tops: list[int]) -> bool:
    while True:
        if inode in tops:
            return True
        if inode == ROOT:
            return False
        inode = tree.parent(inode)


def with_ancestors(tree: Tree, inodes: list[int]) -> frozenset[int]:
    visible = set(inodes)
    for inode in inodes:
        while inode != ROOT:
            inode = tree.parent(inode)
            if inode in visible:
                break
            visible.add(inode)
    return frozenset(visible)


class GrepService:
    def __init__(
        self,
        tree: Tree,
        store: Store,
        content: ContentCache,
        sessions: Sessions,
        served: Served,
        nursery: trio.Nursery,
    ) -> None:
        self.tree = tree
        self._unindexed: list[int] | None = None
        self.store = store
        self.content = content
        self.sessions = sessions
        self.served = served
        self.nursery = nursery

    def swap(self, tree: Tree) -> None:
        self.tree = tree
        self._unindexed = None

    @property
    def unindexed(self) -> list[int]:
        """Files the text index cannot answer for: candidates for every pattern.
        Found at the first search, not at mount: a pass over every file."""
        if self._unindexed is None:
            self._unindexed = self.tree.unindexed(TEXT_LIMIT)
        return self._unindexed

    async def grep(self, request: dict[str, Any], pid: int) -> dict[str, Any]:
        # Imported at the first search, not with the daemon: the planner's and the
        # regex parser's dataclasses took 13 ms of mount-ready to define.
        from esfuse.grep import plan

        patterns = _strings(request.get("patterns"), "patterns", MAX_PATTERNS)
        scopes = _strings(request.get("scopes"), "scopes", MAX_SCOPES)
        dialect = request.get("dialect")
        if dialect not in ("G", "E", "F", "P"):
            raise ProtocolError(f"unknown dialect {dialect!r}")
        every_file = request.get("every_file") is True
        query = (
            plan.ALL
            if every_file
            else plan.plan(
                patterns, dialect=dialect, ignore_case=request.get("ignore_case") is True
            )
        )
        tops = scope_inodes(self.tree, scopes)
        if not tops:  # no operand exists: grep will say so, and reads nothing here
            candidates: list[int] = []
            mode = "all" if isinstance(query, plan.All) else "filtered"
        elif (
            isinstance(query, plan.All)
            or (hits := await self._search(plan.to_elasticsearch(query), tops)) is None
        ):
            # In traversal order, each once.
            candidates = list(dict.fromkeys(i for t in tops for i in self.tree.file_inodes(t)))
            mode = "all"
        else:
            found = self._current(hits) + [
                (self.tree.path(i), i) for i in self.unindexed if _under(self.tree, i, tops)
            ]
            # Traversal order: component by component, as NUL sorts before any name's
            # character (a key of split paths took 15 ms over 7,000 hits, this 3).
            found.sort(key=lambda entry: entry[0].replace("/", "\0"))
            candidates = [inode for _, inode in found]
            self._narrow(pid, with_ancestors(self.tree, candidates))
            mode = "filtered"
        # Grep starts at once; its reads wait for batches still on their way. It reads
        # what the kernel was given from the kernel: looking that up in the cache cost
        # 40 ms of an unselective esgrep over a preloaded tldr, for nothing.
        wanted = (i for i in candidates if not self.served.given(i))
        self.content.prefetch(self.nursery, self.tree.contents_of(wanted))
        log.debug("grep %r in %s: %d candidates (%s)", patterns, scopes, len(candidates), mode)
        return {"mode": mode, "candidates": len(candidates)}

    async def _search(self, query: dict[str, Any], tops: list[int]) -> set[tuple[str, str]] | None:
        """The files that may match; None when so many may that grep is better off
        reading everything than the daemon listing every hit (see UNSELECTIVE)."""
        paths = [self.tree.path(inode) for inode in tops]
        share = UNSELECTIVE_WARM if self.served.share >= WARM else UNSELECTIVE
        limit = int(self.tree.file_count * share)
        return await self.store.search_files(query, paths, limit)

    def _current(self, hits: set[tuple[str, str]]) -> list[tuple[str, int]]:
        """(path, inode) of the hits that the tree holds with the same content."""
        found = []
        for path, digest in hits:
            inode = self.tree.resolve(path)
            if inode is not None and self.tree.content(inode)[0] == digest:
                found.append((path, inode))
        return found

    def _narrow(self, pid: int, visible: frozenset[int]) -> None:
        """Show `pid` only `visible` until it exits (watched through a pidfd)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # gone already: nothing to narrow
        self.sessions.add(pid, visible)
        self.nursery.start_soon(self._expire, pid, pidfd, visible)

    async def _expire(self, pid: int, pidfd: int, visible: frozenset[int]) -> None:
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
            self.sessions.remove(pid, visible)
