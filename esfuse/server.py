"""The daemon's control socket: a unix socket, owner-only, serving protocol requests.

Each connection carries one request and gets one response. The peer's
credentials come from the kernel (SO_PEERCRED): only the daemon's own user (or
root) is served, and the peer's pid is what an esgrep session is keyed by.
Nothing a client sends can stop the server: malformed, truncated, oversized or
slow requests get an error response (or a closed connection) and the next
client is served as usual.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from esfuse import protocol
from esfuse.errors import EsfuseError

log = logging.getLogger(__name__)

READ_TIMEOUT = 5.0
MAX_CLIENTS = 32
BACKLOG = 128


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int


Handler = Callable[[dict[str, Any], Peer], Awaitable[dict[str, Any]]]


async def bind(path: Path) -> trio.socket.SocketType:
    """A listening socket at `path`, created with mode 0600 (no window where it is wider)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        await sock.bind(os.fspath(path))
    finally:
        os.umask(old)
    sock.listen(BACKLOG)
    return sock


def peer_of(stream: trio.SocketStream) -> Peer:
    creds = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return Peer(*struct.unpack("3i", creds))


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise protocol.ProtocolError("connection closed mid-message")
        data += chunk
    return bytes(data)


async def read_request(stream: trio.SocketStream) -> dict[str, Any]:
    with trio.fail_after(READ_TIMEOUT):
        length = protocol.frame_length(await _receive_exactly(stream, 4))
        return protocol.decode(await _receive_exactly(stream, length))


class ControlServer:
    """Dispatches requests by their "op" to handlers."""

    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.limiter = trio.CapacityLimiter(MAX_CLIENTS)
        self.uid = os.getuid()

    async def serve(self, sock: trio.socket.SocketType) -> None:
        await trio.serve_listeners(self.connection, [trio.SocketListener(sock)])

    async def connection(self, stream: trio.SocketStream) -> None:
        async with stream, self.limiter:
            try:
                response = await self.respond(stream)
                await stream.send_all(protocol.encode(response))
                await self.drain(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                pass
            except Exception:
                log.exception("control connection failed")

    async def drain(self, stream: trio.SocketStream) -> None:
        """Read what the client sent beyond its request before closing.

        Closing a unix socket with unread input resets the connection, and the
        client would lose the response it has not read yet (an oversized request
        is answered before its body is read).
        """
        await stream.send_eof()
        with trio.move_on_after(READ_TIMEOUT):
            received = 0
            while received <= protocol.MAX_FRAME and (chunk := await stream.receive_some()):
                received += len(chunk)

    async def respond(self, stream: trio.SocketStream) -> dict[str, Any]:
        peer = peer_of(stream)
        if peer.uid not in (self.uid, 0):
            log.warning("refused a control request from uid %d (pid %d)", peer.uid, peer.pid)
            return {"ok": False, "error": "permission denied"}
        try:
            request = await read_request(stream)
            handler = self.handlers.get(request.get("op"))  # type: ignore[arg-type]
            if handler is None:
                raise protocol.ProtocolError(f"unknown op {request.get('op')!r}")
            return {"ok": True, **await handler(request, peer)}
        except trio.TooSlowError:
            return {"ok": False, "error": f"no complete request within {READ_TIMEOUT:.0f} s"}
        except EsfuseError as e:
            return {"ok": False, "error": str(e)}
