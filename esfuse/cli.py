"""The `esfuse` command line: ingest, mount, umount, status, sandbox.

Errors a user can act on are `EsfuseError`s, printed as one line with exit
status 1; usage errors are click's, with status 2.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import trio

from esfuse import daemon, ingest, protocol, sandbox, store
from esfuse.access import EVERYTHING, Rules, Viewer
from esfuse.config import default_map
from esfuse.errors import EsfuseError
from esfuse.treecache import local_directory

log = logging.getLogger(__name__)

T = TypeVar("T")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(value: str) -> int:
    """`256M`, `1G`, `65536` → bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", value, re.IGNORECASE)
    if not m:
        raise click.BadParameter(f"{value!r} is not a size like 512M or 2G")
    return int(m[1]) * _UNITS[m[2].upper()]


def _index_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return store.check_name(value)
    except EsfuseError as e:
        raise click.BadParameter(str(e)) from None


index_option = click.option(
    "--index",
    envvar="ESFUSE_INDEX",
    default="docs",
    show_default=True,
    callback=_index_name,
    help="Docs index name (env ESFUSE_INDEX).",
)


def _api_key(ctx: click.Context, param: click.Parameter, value: Path | None) -> str | None:
    if value is None:
        return None
    try:
        return value.read_text().strip()
    except OSError as e:
        raise click.BadParameter(f"cannot read {value}: {e.strerror}") from None


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say how to reach Elasticsearch; the command gets a `Connection`."""
    options = [
        click.option(
            "--es",
            "url",
            envvar="ESFUSE_ES",
            default="http://127.0.0.1:9200",
            show_default=True,
            help="Elasticsearch URL (env ESFUSE_ES).",
        ),
        click.option(
            "--cloud-id",
            envvar="ESFUSE_CLOUD_ID",
            help="Elastic Cloud id, instead of --es (env ESFUSE_CLOUD_ID).",
        ),
        click.option("--api-key", envvar="ESFUSE_API_KEY", help="API key (env ESFUSE_API_KEY)."),
        click.option(
            "--api-key-file",
            type=click.Path(path_type=Path),
            callback=_api_key,
            help="Read the API key from this file.",
        ),
        click.option(
            "--ca-certs",
            type=click.Path(exists=True, dir_okay=False),
            help="CA bundle to verify the cluster's certificate.",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(0.1),
            default=10.0,
            show_default=True,
            help="Seconds before a request to Elasticsearch gives up.",
        ),
    ]

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        url: str,
        cloud_id: str | None,
        api_key: str | None,
        api_key_file: str | None,
        ca_certs: str | None,
        timeout: float,
        **kwargs: Any,
    ) -> Any:
        conn = store.Connection(
            url=url,
            timeout=timeout,
            api_key=api_key_file or api_key,
            ca_certs=ca_certs,
            cloud_id=cloud_id,
        )
        return command(*args, conn=conn, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


class Cli(click.Group):
    """Prints user errors as one line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EsfuseError as e:
            click.echo(f"esfuse: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("esfuse: interrupted", err=True)
            sys.exit(130)


@click.group(cls=Cli)
@click.option("-v", "--verbose", is_flag=True, help="Log progress (INFO).")
@click.option("--debug", is_flag=True, help="Log everything (DEBUG).")
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="ESFUSE_CONFIG",
    help="TOML settings (under flags and ESFUSE_* variables; env ESFUSE_CONFIG).",
)
@click.version_option(package_name="esfuse")
@click.pass_context
def main(ctx: click.Context, verbose: bool, debug: bool, config: Path | None) -> None:
    """Mount documentation stored in Elasticsearch as a read-only file tree."""
    if config is not None:
        assert isinstance(ctx.command, click.Group)
        ctx.default_map = default_map(config, ctx.command)
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        # The HTTP client logs every request at INFO and each retry as a WARNING with
        # a traceback; our own one-line errors say what failed.
        logging.getLogger("elastic_transport").setLevel(logging.ERROR)
        logging.getLogger("httpx").setLevel(logging.WARNING)


def with_store(
    conn: store.Connection, index: str, work: Callable[[store.Store], Awaitable[T]]
) -> T:
    """Run `work` under trio with a connected store, closing the client afterwards."""

    async def run() -> T:
        client = store.connect(conn)
        try:
            return await work(store.Store(client, index, conn.where))
        finally:
            await client.close()

    return trio.run(run)


@main.command("ingest")
@click.argument("src", type=click.Path(path_type=Path))
@connection_options
@index_option
@click.option(
    "--access",
    "access_file",
    type=click.Path(path_type=Path),
    help="Access rules (JSON) giving each path its visibility; default: all public.",
)
@click.option(
    "--manifest",
    type=click.Path(path_type=Path),
    help="JSON list of external files (path, url, size, mtime), fetched on first read.",
)
@click.option(
    "--checksum", is_flag=True, help="Hash every file instead of trusting unchanged size and mtime."
)
@click.option("--break-lock", is_flag=True, help="Remove a lock left by an ingest that died.")
def ingest_command(
    src: Path,
    conn: store.Connection,
    index: str,
    access_file: Path | None,
    manifest: Path | None,
    checksum: bool,
    break_lock: bool,
) -> None:
    """Index every regular file under SRC and publish the new tree."""
    started = time.monotonic()
    rules = Rules.load(access_file) if access_file else Rules()

    async def work(s: store.Store) -> ingest.Summary:
        if break_lock:
            await s.break_lock()
        return await ingest.ingest(s, src, checksum=checksum, rules=rules, manifest=manifest)

    summary = with_store(conn, index, work)
    click.echo(summary.line(src, index, time.monotonic() - started))


def _viewer(groups: str | None, everything: bool) -> Viewer:
    if everything and groups:
        raise click.UsageError("--all and --groups exclude each other")
    if everything:
        return EVERYTHING
    return Viewer(frozenset(g.strip() for g in (groups or "").split(",") if g.strip()))


@main.command("mount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
@connection_options
@index_option
@click.option("-f", "--foreground", is_flag=True, help="Serve in this process until unmounted.")
@click.option("--groups", help="Comma-separated groups: show public files and theirs.")
@click.option(
    "--all", "everything", is_flag=True, help="Show every file, whatever its access (operators)."
)
@click.option(
    "--refresh",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds between checks for a newly published tree (0: only on SIGHUP).",
)
@click.option(
    "--cache-size",
    default="256M",
    show_default=True,
    callback=lambda c, p, v: parse_size(v),
    help="Memory for file contents.",
)
@click.option(
    "--tree-cache/--no-tree-cache",
    default=True,
    show_default=True,
    help="Keep decoded trees on local disk, so a later mount skips fetching them.",
)
@click.option(
    "--keep-contents/--no-keep-contents",
    default=True,
    show_default=True,
    help="Keep preloaded contents on local disk, so a later mount's preload reads them "
    "from there first.",
)
@click.option(
    "--preload/--no-preload",
    default=True,
    show_default=True,
    help="Load all contents in the background when they fit in half the cache, "
    "and hand them to the kernel's page cache.",
)
@click.option(
    "--allow-other",
    is_flag=True,
    help="Let other users read the mount (needs user_allow_other for non-root).",
)
@click.option(
    "--debug-fuse",
    is_flag=True,
    help="Trace every FUSE request on stderr (with --foreground).",
)
@click.option(
    "--log-file",
    type=click.Path(path_type=Path),
    help="Daemon log (default: next to its runtime record).",
)
def mount_command(
    mountpoint: Path,
    conn: store.Connection,
    index: str,
    foreground: bool,
    groups: str | None,
    everything: bool,
    refresh: float,
    cache_size: int,
    tree_cache: bool,
    keep_contents: bool,
    preload: bool,
    allow_other: bool,
    debug_fuse: bool,
    log_file: Path | None,
) -> None:
    """Mount the docs index at MOUNTPOINT (read-only)."""
    options = daemon.MountOptions(
        mountpoint=mountpoint,
        connection=conn,
        index=index,
        viewer=_viewer(groups, everything),
        cache_bytes=cache_size,
        preload=preload,
        tree_cache=local_directory("trees") if tree_cache else None,
        packs=local_directory("packs") if keep_contents else None,
        refresh=refresh,
        allow_other=allow_other,
        debug_fuse=debug_fuse,
        log_file=log_file,
    )
    daemon.mount(options, foreground=foreground)
    if not foreground:
        # The mount is ready and this process holds nothing to clean up; tearing the
        # interpreter down (every module elasticsearch and trio loaded) took 60-100 ms
        # of mount-ready.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@main.command("umount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
def umount_command(mountpoint: Path) -> None:
    """Unmount MOUNTPOINT and wait for its daemon to exit."""
    daemon.umount(mountpoint)


@main.command("status")
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's answer as JSON.")
def status_command(mountpoint: Path, as_json: bool) -> None:
    """What the daemon serving MOUNTPOINT is doing: tree, cache, requests."""
    try:
        path = protocol.socket_of(mountpoint)
        answer = protocol.call(path, {"op": "status"}, 10.0)
    except (OSError, EsfuseError) as e:
        raise EsfuseError(f"{mountpoint}: no esfuse daemon answers ({e})") from None
    if not answer.get("ok"):
        raise EsfuseError(f"{mountpoint}: {answer.get('error')}")
    if as_json:
        click.echo(json.dumps(answer, indent=2, sort_keys=True))
        return
    try:
        lines = _status_lines(answer)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise EsfuseError(
            f"{mountpoint}: the daemon's status is not what this esfuse expects"
            f" ({type(e).__name__}: {e}); --json shows it whole"
        ) from None
    for label, value in lines:
        click.echo(f"{label:<19} {value}")


def _status_lines(answer: dict[str, Any]) -> list[tuple[str, str]]:
    """The status answer as labelled lines, for people."""
    hits, misses = answer["cache_hits"], answer["cache_misses"]
    rate = f"{100 * hits / (hits + misses):.0f}%" if hits + misses else "n/a"
    requests = ", ".join(f"{n} {k}" for k, n in sorted(answer["requests"].items())) or "none"
    latency = ", ".join(f"{k} {v} ms" for k, v in answer["latency_ms"].items()) or "n/a"
    return [
        ("index", answer["index"]),
        (
            "tree",
            f"version {answer['tree_version']}, {answer['files']} files, "
            f"loaded {answer['tree_age']:.0f} s ago in {answer['tree_load_ms']:.0f} ms",
        ),
        ("last refresh error", answer["last_refresh_error"] or "none"),
        (
            "cache",
            f"{answer['cache_bytes'] / 1e6:.1f} MB, hit rate {rate} ({hits} hits, {misses} misses)",
        ),
        (
            "preload",
            f"{answer['preload']}, {answer['handed_to_kernel']} files in the kernel, "
            # Not from daemons older than the packs, which may still be serving.
            f"{answer.get('from_local_disk', 0)} of them from local disk",
        ),
        ("requests", requests),
        ("latency", latency),
        ("memory", f"{answer['rss_bytes'] / 1e6:.0f} MB resident (pid {answer['pid']})"),
        ("uptime", f"{answer['uptime']:.0f} s"),
    ]


@main.command("sandbox", context_settings={"ignore_unknown_options": True})
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
@connection_options
@click.option(
    "--groups",
    help="Show the sandbox a private view of the index: public files "
    "and these groups' (needs the connection options).",
)
def sandbox_command(
    mountpoint: Path, command: tuple[str, ...], conn: store.Connection, groups: str | None
) -> None:
    """Run COMMAND (after --) confined with bubblewrap: the docs at /docs, no network."""
    view = (conn, _viewer(groups, False)) if groups is not None else None
    sandbox.run(mountpoint, list(command), view)
