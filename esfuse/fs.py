"""The pyfuse3 adapter: kernel requests in, answers from the tree and the content cache out.

This class holds no logic of its own beyond translating. Every handler passes
through `boundary`, the one place where failures become errno values: pyfuse3
lets only `FUSEError` out of a handler, and any other exception would end
`pyfuse3.main()` and with it the mount.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import pyfuse3
import trio

from esfuse.cache import ContentCache
from esfuse.errors import StoreError
from esfuse.grep.service import Served, Sessions
from esfuse.tree import Changes, Node, Tree

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# The tree only changes through a refresh, which invalidates what it changes, so
# the kernel may keep names and attributes for long.
TIMEOUT = 300.0
BLOCK = 4096
READ_AHEAD_WINDOW = 32
# Attributes kept ready for readdir and lookup, which rebuilt them per entry and
# spent half a warm `grep -r` doing so (py-spy); about 200 bytes each.
ATTRIBUTES_KEPT = 1 << 17
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# Our build of pyfuse3 (scripts/build-pyfuse3) hands `read` the inode when no open
# preceded it, so `open` can answer ENOSYS and the kernel stops sending open and
# release: a warm `grep -r` over tldr through a RAM-only pyfuse3 file system took
# 0.23 s so, against 2.0 s with opens.
SKIP_OPENS = getattr(pyfuse3, "READ_GETS_INODE_WITHOUT_OPEN", False)
# It also lets `opendir` ask the kernel to keep a directory's listing
# (FOPEN_CACHE_DIR), so that a warm traversal sends no readdir either: readdirplus
# carries about 25 entries per request, and those requests were what kept a warm
# `grep -r` over tldr at 1.6x a local disk.
CACHE_LISTINGS = getattr(pyfuse3, "OPENDIR_TAKES_FILEINFO", False)
# Files per store in the kernel's page cache: how often a hand-over asks whether to stop.
STORE_STEP = 64


def boundary(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Let FUSEError through; log anything else as one line and answer EIO."""

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except StoreError as e:
            log.error("%s %s: %s", handler.__name__, _subject(args), e)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except KeyError:
            # An inode the tree does not know (stale kernel state): it is gone.
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except Exception:
            log.exception("unexpected error in %s %s", handler.__name__, _subject(args))
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _subject(args: tuple[Any, ...]) -> str:
    """The path a request is about, when its first argument is an inode (or fh = inode)."""
    ops, first = args[0], args[1] if len(args) > 1 else None
    try:
        return "/" + ops.tree.path(first) if isinstance(first, int) else ""
    except KeyError:
        return f"inode {first}"


class Operations(pyfuse3.Operations):
    """A read-only view of one tree."""

    def __init__(
        self,
        tree: Tree,
        content: ContentCache,
        nursery: trio.Nursery,
        sessions: Sessions,
        served: Served,
        listed: Callable[[int], None] = lambda directory: None,
    ) -> None:
        super().__init__()
        self.tree = tree
        # The tree a refresh replaced: the kernel may still hold its inodes for a moment
        # (entry invalidation is asynchronous), and opening one must give the old version.
        self.previous: Tree | None = None
        self.content = content
        self.nursery = nursery
        self.sessions = sessions
        self.served = served
        self.listed = listed  # told each directory the kernel has read to its end
        self.uid = os.getuid()
        self.gid = os.getgid()
        self._misses_in_dir: dict[int, int] = {}
        self._opened: set[int] = set()  # directories opened since the tree was loaded
        self._attributes: dict[int, pyfuse3.EntryAttributes] = {}
        # Directory handles above the inode range: listings narrowed for an esgrep session.
        self._narrowed: dict[int, tuple[int, list[tuple[bytes, int]]]] = {}
        self._next_handle = 1 << 48

    def swap(self, tree: Tree) -> None:
        self.previous, self.tree = self.tree, tree
        self._misses_in_dir.clear()  # a new version is worth reading ahead again
        self._opened.clear()
        self._attributes.clear()

    def node(self, inode: int) -> Node:
        """An inode of the current tree, or of the one just replaced."""
        return self._either(Tree.node, inode)

    def _either(self, get: Callable[[Tree, int], T], inode: int) -> T:
        try:
            return get(self.tree, inode)
        except KeyError:
            if self.previous is None:
                raise
            return get(self.previous, inode)

    def attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        attr = self._attributes.get(inode)
        if attr is None:
            if len(self._attributes) >= ATTRIBUTES_KEPT:
                self._attributes.clear()
            attr = self._attributes[inode] = self._build_attributes(inode)
        return attr

    def _build_attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        is_dir, size, mtime_ns, nlink = self._either(Tree.stat, inode)
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = pyfuse3.InodeT(inode)
        attr.entry_timeout = TIMEOUT
        attr.attr_timeout = TIMEOUT
        attr.st_mode = pyfuse3.ModeT(0o040555 if is_dir else 0o100444)
        attr.st_nlink = nlink
        attr.st_uid = self.uid
        attr.st_gid = self.gid
        attr.st_size = size
        attr.st_blksize = BLOCK
        attr.st_blocks = -(-size // 512)
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = mtime_ns
        return attr

    @boundary
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        if name == b".":
            return self.attributes(parent_inode)
        if name == b"..":
            return self.attributes(self.tree.parent(parent_inode))
        inode = self.tree.lookup(parent_inode, name)
        if inode is None:
            # st_ino 0 makes the kernel cache the miss for entry_timeout.
            miss = pyfuse3.EntryAttributes()
            miss.st_ino = pyfuse3.InodeT(0)
            miss.entry_timeout = TIMEOUT
            return miss
        return self.attributes(inode)

    @boundary
    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        return self.attributes(inode)

    @boundary
    async def opendir(self, inode: int, ctx: Any) -> Any:
        if not self.tree.is_dir(inode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        self._opened.add(inode)
        visible = self.sessions.visible(ctx.pid)
        if visible is None:
            return _directory_handle(inode, cached=True)
        self._next_handle += 1
        listing = [entry for entry in self.tree.listing(inode) if entry[1] in visible]
        self._narrowed[self._next_handle] = (inode, listing)
        # A narrowed listing neither comes from nor goes to the kernel's copy, which
        # stays for everyone else.
        return _directory_handle(self._next_handle, cached=False)

    @boundary
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        narrowed = self._narrowed.get(fh)
        inode, listing = narrowed or (fh, self.tree.listing(fh))
        if start_id >= len(listing) + 2 and narrowed is None:
            # Asked past the end: the kernel has taken in every earlier answer, and
            # made an inode for each entry, to which contents can now be handed.
            self.listed(inode)
        # `.` and `..` first (ids 1 and 2), as on a disk file system; `ls -a` shows them.
        for next_id in range(start_id + 1, len(listing) + 3):
            if next_id <= 2:
                name, entry = (b".", inode) if next_id == 1 else (b"..", self.tree.parent(inode))
            else:
                name, entry = listing[next_id - 3]
            if not pyfuse3.readdir_reply(token, name, self.attributes(entry), next_id):
                break

    @boundary
    async def releasedir(self, fh: int) -> None:
        self._narrowed.pop(fh, None)

    @boundary
    async def open(self, inode: int, flags: int, ctx: Any) -> Any:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if self.node(inode).digest is None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if SKIP_OPENS:
            # The kernel takes this open as done, with keep_cache, and asks for no more.
            raise pyfuse3.FUSEError(errno.ENOSYS)
        # The handle is the inode, as with no opens at all: `read` serves both alike.
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(inode), keep_cache=True)

    def _read_ahead(self, inode: int) -> None:
        """Fetch siblings before they are asked for, when the misses look like a traversal.

        Each uncached read costs a round trip to Elasticsearch (about 3 ms here),
        and `grep -r` reads a directory's files one after another: the first miss
        in a directory brings a small window of the files after it in listing
        order, the second brings the rest of the directory, in a few requests.
        The missed file itself is not in them: its read asked for it alone, which
        answers sooner than a batch.
        A traversal lists a directory before it reads it. In a directory no one
        has listed, a miss is most likely a lone `cat`, and the window starts
        only at the second miss: read ahead at once, the window was still
        loading when the next unrelated read came, which made single reads of
        uncached files take 4.4 ms instead of 2.9 (p50, 60 directories of tldr).
        Only misses count, so an esgrep session, whose candidates the daemon has
        already fetched, reads ahead nothing.
        """
        try:
            parent = self.tree.parent(inode)
        except KeyError:
            return  # an inode of the replaced tree: no traversal to anticipate
        misses = self._misses_in_dir.get(parent, 0)
        self._misses_in_dir[parent] = misses + 1
        step = misses if parent in self._opened else misses - 1
        if step not in (0, 1):
            return
        listing = self.tree.listing(parent)
        start = 1 + next(i for i, (_, child) in enumerate(listing) if child == inode)
        stop = start + READ_AHEAD_WINDOW if step == 0 else len(listing)
        window = (child for _, child in listing[start:stop])
        self.content.prefetch(self.nursery, self.tree.contents_of(window))

    @boundary
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:
        # fh is the inode (see open). Its content never changes (see Tree), and an
        # inode a refresh just dropped is still in the previous tree.
        digest, length = self._either(Tree.content, fh)
        if digest is None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        self.served.mark(fh)
        data = self.content.cached(digest, length, off, size)
        if data is not None:
            return data
        missed = not self.content.holds(digest, off)
        data = await self.content.read(digest, length, off, size)
        if missed:
            # After this read, not before: a lone `cat` does not wait behind a batch
            # (p50 6-7 ms with it first), and a traversal's next read still finds
            # its file on the way.
            self._read_ahead(fh)
        return data

    async def release(self, fh: int) -> None:
        return None  # opens keep no state

    @boundary
    async def access(self, inode: int, mode: int, ctx: Any) -> bool:
        self.node(inode)
        return not mode & os.W_OK

    @boundary
    async def statfs(self, ctx: Any) -> Any:
        stat = pyfuse3.StatvfsData()
        stat.f_bsize = stat.f_frsize = BLOCK
        stat.f_blocks = -(-self.tree.total_size // BLOCK)
        stat.f_bfree = stat.f_bavail = 0
        stat.f_files = self.tree.inode_count
        stat.f_ffree = stat.f_favail = 0
        stat.f_namemax = 255
        return stat

    # No getxattr or listxattr: pyfuse3 answers ENOSYS, and from then on the kernel
    # answers every extended attribute call itself (EOPNOTSUPP). `ls -l` asks two per
    # file (security.selinux, system.posix_acl_access): on a 100,000-entry directory
    # they were 200,000 requests and most of its 7 s.

    async def forget(self, inode_list: Any) -> None:
        # Inodes are positions in an immutable tree: there is nothing to free.
        return None

    async def _refuse_write(self, *args: Any, **kwargs: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    # The kernel `ro` option stops these before they reach us; refusing here too
    # keeps the file system read-only even if it is mounted without it.
    setattr = mknod = mkdir = unlink = rmdir = symlink = rename = link = _refuse_write
    write = create = setxattr = removexattr = fsync = fsyncdir = _refuse_write


def _directory_handle(fh: int, cached: bool) -> Any:
    if not CACHE_LISTINGS:
        return pyfuse3.FileHandleT(fh)
    return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fh), keep_cache=True, cache_readdir=cached)


# A whole content for the kernel: (inode, data).
Stored = tuple[int, bytes | memoryview]


def hand_to_kernel(
    contents: Sequence[Stored], stopping: Callable[[], bool]
) -> tuple[list[int], bool]:
    """Store whole contents in the kernel's page cache: the inodes it took, and
    whether it refused any for a reason other than not knowing the inode.

    It may wait on the lock of a page whose read is in flight, which only our
    answer to that read releases: call it from a thread, never from the one
    answering requests. `stopping` is asked before each step of STORE_STEP files.
    """
    taken: list[int] = []
    for start in range(0, len(contents), STORE_STEP):
        if stopping():
            break
        step = contents[start : start + STORE_STEP]
        for stored, error in zip(step, _store(step), strict=False):  # _store stops at a refusal
            inode = stored[0]
            if not error:
                taken.append(inode)
            elif error != errno.ENOENT:  # ENOENT: the kernel let it go; a read will ask
                log.warning(
                    "the kernel refused contents for inode %d: %s", inode, os.strerror(error)
                )
                return taken, True
    return taken, False


def _store_each(contents: Sequence[Stored]) -> list[int]:
    """`notify_store_many` for stock pyfuse3: one call, and one release of the
    interpreter lock, per file."""
    errors = []
    for inode, data in contents:
        try:
            pyfuse3.notify_store(pyfuse3.InodeT(inode), 0, data)
        except OSError as e:
            errors.append(e.errno or errno.EIO)
            if e.errno != errno.ENOENT:
                break
        else:
            errors.append(0)
    return errors


# Our build of pyfuse3 stores many contents with one release of the interpreter
# lock. Stored one call at a time, the hand-over thread took the lock back after
# every file, and waited for it while the main thread answered requests.
_store: Callable[[Sequence[Stored]], list[int]] = getattr(pyfuse3, "notify_store_many", _store_each)


async def invalidate(changes: Changes) -> None:
    """Make the kernel forget what a refresh changed: names, listings and
    attributes; returns once it has.

    Contents need no invalidation: a changed file is a new inode. An entry
    invalidation waits for any request on its directory, which this thread may
    be the one to answer, so they run in a worker thread, as pyfuse3 advises.
    They are awaited, not queued (pyfuse3's invalidate_entry_async), because
    what follows relies on them being done: the preload lists the directories
    again so that the kernel knows the new inodes, and a name dropped after that
    took its new inode with it, which the kernel then refused contents for.
    Inode invalidation does not wait on us: attributes touch no page, and the
    pages of a directory, where the kernel keeps its listing, are locked only
    while the kernel copies entries in or out, never across a request.
    """
    await trio.to_thread.run_sync(_forget_entries, changes, abandon_on_cancel=True)
    relisted = {parent for parent, _, _ in changes.gone} | {p for p, _ in changes.added}
    for inode in relisted:
        _forget(inode, attr_only=False)
    for inode in set(changes.touched) - relisted:
        _forget(inode, attr_only=True)


def _forget_entries(changes: Changes) -> None:
    """In a worker thread: drop the names that went or came."""
    for parent, name, inode in changes.gone:
        _forget_entry(parent, name, inode)
    for parent, name in changes.added:
        _forget_entry(parent, name, 0)


def _forget_entry(parent: int, name: bytes, deleted: int) -> None:
    try:
        pyfuse3.invalidate_entry(pyfuse3.InodeT(parent), name, pyfuse3.InodeT(deleted))
    except OSError as e:
        if e.errno != errno.ENOENT:  # the kernel never looked it up: nothing to forget
            log.warning("invalidating %r in inode %d: %s", name, parent, e)


def _forget(inode: int, attr_only: bool) -> None:
    try:
        pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=attr_only)
    except OSError as e:
        if e.errno != errno.ENOENT:  # the kernel never looked it up: nothing to forget
            log.warning("invalidating inode %d: %s", inode, e)
