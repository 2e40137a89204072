"""The mount's life: checks, start-up, readiness, signals, unmount.

`mount` returns only once the kernel mount answers (or fails with the reason):
in the background case a forked child loads the tree, mounts, and reports
"ready" or the error through a pipe, then detaches. Each running mount leaves a
small record in the runtime directory, keyed by its mountpoint, so that
`esfuse umount` (and later tools) can find the daemon that serves a path.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyfuse3
import trio
from elasticsearch import AsyncElasticsearch

from esfuse import protocol
from esfuse.access import Viewer
from esfuse.cache import ContentCache
from esfuse.errors import EsfuseError
from esfuse.external import Fetcher, split_loader
from esfuse.fs import Operations, invalidate
from esfuse.grep.service import GrepService, Served, Sessions
from esfuse.mountinfo import FSTYPE, fstype_at
from esfuse.pack import Keeper, Packs
from esfuse.preload import Preload
from esfuse.refresh import Refresher, TreeUser
from esfuse.server import ControlServer, Peer, bind
from esfuse.store import Connection, Store, connect
from esfuse.tree import Changes
from esfuse.treecache import TreeCache

log = logging.getLogger(__name__)

PUBLIC_ONLY = Viewer()
# How long unmounting waits for a hand-over of contents to the kernel to stop.
STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class MountOptions:
    mountpoint: Path
    connection: Connection
    index: str
    viewer: Viewer = PUBLIC_ONLY
    cache_bytes: int = 256 << 20
    preload: bool = True
    tree_cache: Path | None = None
    packs: Path | None = None  # where preloaded contents are kept; None: not kept
    refresh: float = 10.0
    allow_other: bool = False
    debug_fuse: bool = False
    log_file: Path | None = None


# -- where running mounts are recorded ------------------------------------------


def runtime_dir() -> Path:
    configured = os.environ.get("ESFUSE_RUNTIME_DIR")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/run/esfuse")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "esfuse" if xdg else Path(f"/tmp/esfuse-{os.geteuid()}")


def record_path(mountpoint: Path, suffix: str = ".json") -> Path:
    key = hashlib.sha1(os.fsencode(mountpoint)).hexdigest()[:16]
    return runtime_dir() / f"{key}{suffix}"


def write_record(mountpoint: Path, index: str, es_url: str) -> None:
    path = record_path(mountpoint)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {"mountpoint": str(mountpoint), "pid": os.getpid(), "index": index, "es": es_url}
        )
    )
    tmp.replace(path)


def read_record(mountpoint: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(record_path(mountpoint).read_text())
    except (OSError, ValueError):
        return None
    return (
        record if isinstance(record, dict) and record.get("mountpoint") == str(mountpoint) else None
    )


# -- mounting ----------------------------------------------------------------------


def check_mountpoint(path: Path) -> Path:
    mountpoint = Path(os.path.abspath(path))
    if fstype_at(mountpoint) == FSTYPE and _dead(mountpoint):
        _clear_dead(mountpoint)
    if fstype_at(mountpoint):
        raise EsfuseError(f"{mountpoint} is already a mount point")
    if not mountpoint.exists():
        raise EsfuseError(f"mountpoint {mountpoint} does not exist")
    if not mountpoint.is_dir():
        raise EsfuseError(f"mountpoint {mountpoint} is not a directory")
    if any(mountpoint.iterdir()):
        raise EsfuseError(f"mountpoint {mountpoint} is not empty")
    return mountpoint


def _dead(mountpoint: Path) -> bool:
    """A FUSE mount whose daemon is gone answers "Transport endpoint is not connected"
    (or, the first time after the daemon's death, "Software caused connection abort")."""
    # statvfs, not stat: the kernel answers stat from the attributes it keeps, even
    # with no daemon behind them, but asks the daemon for every statfs.
    try:
        os.statvfs(mountpoint)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def _fusermount(mountpoint: Path, *flags: str) -> None:
    """Unmount with fusermount3; its complaint, if any, becomes the error."""
    done = subprocess.run(
        ["fusermount3", "-u", *flags, str(mountpoint)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise EsfuseError(done.stderr.strip() or f"cannot unmount {mountpoint}")


def remove_record(mountpoint: Path) -> None:
    for suffix in (".json", ".sock"):
        record_path(mountpoint, suffix).unlink(missing_ok=True)


def _clear_dead(mountpoint: Path) -> None:
    _fusermount(mountpoint, "-z")
    remove_record(mountpoint)
    print(
        f"esfuse: cleared a dead esfuse mount at {mountpoint} (its daemon had died)",
        file=sys.stderr,
    )


def mount(options: MountOptions, *, foreground: bool) -> None:
    """Mount and serve; in the background case, return once the mount is ready."""
    mountpoint = check_mountpoint(options.mountpoint)
    options = MountOptions(**{**options.__dict__, "mountpoint": mountpoint})
    # Made before forking, though only the daemon uses it: making it imports
    # httpx's transport (httpcore, h11, anyio), which took the forked daemon
    # 35-50 ms on its way to ready, against about 6 ms after the other imports.
    client = connect(options.connection)
    if foreground:
        trio.run(serve, options, client, notify_systemd)
        return
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(write_end)
        _await_ready(read_end, options)
        return
    os.close(read_end)
    _run_daemon(options, client, write_end)


def _await_ready(read_end: int, options: MountOptions) -> None:
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode("utf-8", "replace").strip()
    if message != "ready":
        log_file = options.log_file or record_path(options.mountpoint, ".log")
        raise EsfuseError(message or f"the daemon died before the mount was ready (see {log_file})")


def _run_daemon(options: MountOptions, client: AsyncElasticsearch, write_end: int) -> None:
    """The forked child: never returns; reports the outcome of start-up through `write_end`."""
    os.setsid()
    log_file = options.log_file or record_path(options.mountpoint, ".log")
    _log_to(log_file)

    def ready() -> None:
        notify_systemd()
        os.write(write_end, b"ready")
        os.close(write_end)
        _detach_stdio()

    code = 0
    try:
        trio.run(serve, options, client, ready)
    except EsfuseError as e:
        log.error("%s", e)
        with contextlib.suppress(OSError):
            os.write(write_end, str(e).encode())
        code = 1
    except BaseException:
        log.exception("daemon failed")
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)


def notify_systemd() -> None:
    """Tell systemd (Type=notify) that the mount answers; nothing outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(b"READY=1", address)
        except OSError as e:
            log.warning("cannot notify systemd at %s: %s", address, e)


def _log_to(log_file: Path) -> None:
    log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)


def _detach_stdio() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


async def serve(
    options: MountOptions, client: AsyncElasticsearch, ready: Callable[[], None]
) -> None:
    """Load the tree with `client`, mount, serve until unmounted or signalled; then
    close `client`."""
    started_at = time.time()
    try:
        store = Store(client, options.index, options.connection.where, options.viewer)
        started = time.monotonic()
        cache = TreeCache(options.tree_cache) if options.tree_cache else None
        # A tree is millions of objects living as long as the mount, with no cycles.
        # Collections passing over them cost a third of building the million-file
        # tree, and most of a first `ls -l` of its 100,000-entry directory; frozen,
        # the collector skips them (refcounting still frees them).
        gc.disable()
        try:
            pointer, tree = await store.load_tree(options.viewer, cache)
        finally:
            gc.freeze()
            gc.enable()
        load_seconds = time.monotonic() - started
        log.info(
            "loaded tree version %d of %r: %d files in %.3f s",
            pointer.version,
            options.index,
            tree.file_count,
            load_seconds,
        )
        socket_path = record_path(options.mountpoint, ".sock")
        async with (
            Fetcher(tree, options.connection.timeout) as fetcher,
            trio.open_nursery() as nursery,
        ):
            loader = split_loader(store.fetch_chunks, fetcher, pointer.chunk_size)
            keeper = None
            if options.packs and options.preload:
                keeper = Keeper(Packs(options.packs), options.index, pointer.chunk_size)
                loader = keeper.loader(loader)
            content = ContentCache(
                loader, pointer.chunk_size, options.cache_bytes, *([keeper.get] if keeper else [])
            )
            sessions, served = Sessions(), Served(tree)
            grep = GrepService(tree, store, content, sessions, served, nursery)
            preload = (
                Preload(content, nursery, options.mountpoint, served, keeper)
                if options.preload
                else None
            )
            ops = Operations(
                tree, content, nursery, sessions, served, *([preload.listed] if preload else [])
            )
            users: list[TreeUser] = [ops, grep, served, *([preload] if preload else [])]

            async def changed(diff: Changes) -> None:
                await invalidate(diff)
                if preload:
                    preload.start()

            refresher = Refresher(
                store, options.viewer, pointer.version, tree, users, changed, options.refresh
            )
            refresher.load_ms = load_seconds * 1000

            async def grep_op(request: dict[str, Any], peer: Peer) -> dict[str, Any]:
                return await grep.grep(request, peer.pid)

            async def status_op(request: dict[str, Any], peer: Peer) -> dict[str, Any]:
                return status(store, refresher, content, preload, started_at)

            control = ControlServer({"grep": grep_op, "status": status_op})
            source = protocol.mount_source(options.index, str(socket_path))
            listener = await bind(socket_path)
            try:
                _fuse_init(ops, options, source)
                write_record(options.mountpoint, options.index, options.connection.where)
                nursery.start_soon(control.serve, listener)
                # Started, not just scheduled: a SIGTERM right after ready() must unmount.
                await nursery.start(_handle_signals, refresher, preload)
                nursery.start_soon(refresher.run)
                ready()
                if preload:
                    preload.swap(tree)
                    preload.start()
                await _serve_mounted(options, preload)
            finally:
                nursery.cancel_scope.cancel()
                remove_record(options.mountpoint)
    finally:
        await client.close()


async def _serve_mounted(options: MountOptions, preload: Preload | None) -> None:
    """From a successful pyfuse3.init to the end of the mount."""
    try:
        await pyfuse3.main()
    finally:
        if preload:
            await _stop_hand_over(preload, options.mountpoint)
        pyfuse3.close(unmount=fstype_at(options.mountpoint) is not None)
        log.info("unmounted %s", options.mountpoint)


async def _stop_hand_over(preload: Preload, mountpoint: Path) -> None:
    """Let no hand-over of contents to the kernel outlive the session.

    After SIGTERM the signal handler stopped it while requests were still
    answered, and after an unmount no read is in flight, so this returns at once.
    Only when serving failed may a hand-over wait on a page whose read no one
    will answer now; a forced unmount aborts the connection, which ends that read.
    """
    with trio.CancelScope(shield=True):
        if not await preload.stop(STOP_TIMEOUT):
            force_unmount(mountpoint)
            await preload.stop(STOP_TIMEOUT)


def force_unmount(mountpoint: Path) -> None:
    """Abort the FUSE connection at `mountpoint`, ending every request in flight
    (MNT_FORCE), and detach it; needs root."""
    # -c: no canonical path, which would stat through the mount we are aborting.
    done = subprocess.run(
        ["umount", "-f", "-l", "-c", str(mountpoint)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        log.error("cannot force the unmount of %s: %s", mountpoint, done.stderr.strip())
    else:
        log.warning("forced the unmount of %s", mountpoint)


def status(
    store: Store,
    refresher: Refresher,
    content: ContentCache,
    preload: Preload | None,
    started: float,
) -> dict[str, Any]:
    return {
        "uptime": round(time.time() - started, 3),
        "index": store.name,
        "files": refresher.tree.file_count,
        "tree_version": refresher.version,
        "tree_age": round(time.time() - refresher.loaded_at, 3),
        "tree_load_ms": round(refresher.load_ms, 1),
        "pid": os.getpid(),
        "rss_bytes": _rss(),
        "last_refresh_error": refresher.last_error,
        "requests": dict(store.requests),
        "latency_ms": store.latency_ms(),
        "cache_bytes": content.chunks.current_bytes,
        "cache_hits": content.chunks.hits,
        "cache_misses": content.chunks.misses,
        "preload": preload.state if preload else "off",
        "handed_to_kernel": preload.pushed if preload else 0,
        "from_local_disk": preload.from_pack if preload else 0,
    }


def _rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _fuse_init(ops: Operations, options: MountOptions, source: str) -> None:
    fuse_options = set(pyfuse3.default_options) | {
        "ro",
        f"fsname={source}",
        "subtype=esfuse",
        "noatime",
    }
    if options.allow_other:
        fuse_options.add("allow_other")
    if options.debug_fuse:
        fuse_options.add("debug")  # libfuse traces every request on stderr
    try:
        pyfuse3.init(ops, str(options.mountpoint), fuse_options)
    except RuntimeError as e:
        raise EsfuseError(f"cannot mount on {options.mountpoint}: {e}") from None


async def _handle_signals(
    refresher: Refresher,
    preload: Preload | None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                log.info("received SIGHUP, refreshing the tree")
                refresher.wake()
                continue
            log.info("received %s, unmounting", signal.Signals(signum).name)
            if preload:
                await preload.stop(STOP_TIMEOUT)
            pyfuse3.terminate()


# -- unmounting --------------------------------------------------------------------


def alive(pid: int) -> bool:
    # A daemon that has exited is a zombie, which kill(pid, 0) still finds, until
    # its parent reaps it: one forked by this very process (esfuse sandbox
    # --groups), when we do; any other, when init does, which in this project's
    # container took 1-2 s and made every `esfuse umount` wait for it.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        # Gone, or hidden from us (/proc mounted with hidepid): ask the kernel.
        try:
            with contextlib.suppress(PermissionError):  # another user's process
                os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    # The state follows the command name, which is in parentheses and may hold any.
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def umount(path: Path, *, timeout: float = 15.0) -> None:
    """Unmount and wait until the daemon serving `path` has exited."""
    mountpoint = Path(os.path.abspath(path))
    record = read_record(mountpoint)
    fstype = fstype_at(mountpoint)
    pid = record.get("pid") if record else None
    if isinstance(pid, int) and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid):
            if time.monotonic() > deadline:
                raise EsfuseError(
                    f"the daemon for {mountpoint} (pid {pid}) did not exit within {timeout:.0f} s"
                )
            time.sleep(0.02)
    elif fstype is not None and fstype.startswith("fuse"):
        _fusermount(mountpoint)
    else:
        raise EsfuseError(f"{mountpoint} is not an esfuse mount")
