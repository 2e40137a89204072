"""The daemon's control socket protocol: one request, one response, per connection.

A frame is a 4-byte big-endian length followed by that many bytes of a UTF-8
JSON object. Every message carries ``"v": VERSION``; a request names its
``"op"``, a response says ``"ok": true`` or gives an ``"error"``. Frames are
bounded (MAX_FRAME) so a client cannot make the daemon buffer without limit.

This module has no trio or FUSE import: esgrep uses it with a plain blocking
socket, to start fast.
"""

from __future__ import annotations

# esgrep imports this module on every call, and start-up is most of a selective
# esgrep: `socket` and `json` (with the `enum`, `selectors` and `re` they import)
# took 23 ms of the 45 an `esgrep -r ffmpeg` over tldr took, against 2 ms for the
# C modules they wrap. So frames go through those directly, called as `socket`
# and `json` call them.
import _json
import _socket
import errno
import os
import struct
import time

from esfuse import mountinfo
from esfuse.errors import EsfuseError

TYPE_CHECKING = False  # `typing` alone would add a third to esgrep's start-up
if TYPE_CHECKING:
    from typing import Any

VERSION = 1
MAX_FRAME = 1 << 20
_HEADER = struct.Struct(">I")
_WHITESPACE = " \t\n\r"  # JSON's, the only characters allowed around a value


def _unencodable(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# json.dumps(value, separators=(",", ":")), as json.encoder.JSONEncoder calls it.
_encode = _json.make_encoder(
    {}, _unencodable, _json.encode_basestring_ascii, None, ":", ",", False, False, True
)


_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Decoding:
    """The settings json's C scanner reads from a decoder: json.loads' defaults."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int, parse_constant = float, int, _CONSTANTS.__getitem__


_scan = _json.make_scanner(_Decoding())


def dumps(value: object) -> str:
    """`json.dumps(value, separators=(",", ":"))`."""
    return "".join(_encode(value, 0))


def loads(text: str) -> Any:
    """`json.loads(text)`; ValueError, or RecursionError if nested too deeply."""
    text = text.strip(_WHITESPACE)
    try:
        value, end = _scan(text, 0)
    except StopIteration as e:
        raise ValueError(f"expecting a value at character {e.value}") from None
    if end != len(text):
        raise ValueError(f"extra data at character {end}")
    return value


class ProtocolError(EsfuseError):
    """A malformed, truncated or oversized message."""


def mount_source(index: str, socket_path: str) -> str:
    """What an esfuse mount shows as its source in the mount table: the index it
    serves and its daemon's control socket. Any program that sees the mount sees
    its table entry, in a sandbox too, without asking the mount anything."""
    # libfuse splits options at commas and takes backslashes as escapes.
    if any(c in socket_path for c in ",\\") or ":" in index:
        raise EsfuseError(f"cannot name {socket_path!r} of index {index!r} in a mount's source")
    return f"esfuse:{index}:{socket_path}"


def socket_in(source: str) -> str | None:
    """The control socket that an esfuse mount's source (see `mount_source`) names."""
    parts = source.split(":", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "esfuse" else None


def socket_of(mountpoint: str | os.PathLike[str]) -> str:
    """The control socket of the daemon serving `mountpoint` (OSError when there is none)."""
    found = mountinfo.mount_at(mountpoint)
    path = socket_in(found[1]) if found is not None and found[0] == mountinfo.FSTYPE else None
    if path is None:
        raise OSError(errno.ENOENT, "not an esfuse mount", os.fspath(mountpoint))
    return path


def encode(message: dict[str, Any]) -> bytes:
    body = dumps({"v": VERSION, **message}).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    if len(header) != _HEADER.size:
        raise ProtocolError("truncated frame header")
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return length


def decode(body: bytes) -> dict[str, Any]:
    try:
        message = loads(body.decode())
    except ValueError as e:
        raise ProtocolError(f"not JSON: {e}") from None
    except RecursionError:
        raise ProtocolError("not JSON this program can read: nested too deeply") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    if message.get("v") != VERSION:
        raise ProtocolError(f"protocol version {message.get('v')!r}; this esfuse speaks {VERSION}")
    return message


def _receive_exactly(sock: _socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ProtocolError("connection closed mid-message")
        chunks += chunk
    return bytes(chunks)


def call(path: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request and return the response (OSError/TimeoutError when unreachable)."""
    deadline = time.monotonic() + timeout
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        while True:
            try:
                sock.connect(path)
                break
            except BlockingIOError:
                # A unix socket's backlog is full: connect does not wait, so we do.
                if time.monotonic() > deadline:
                    raise TimeoutError from None
                time.sleep(0.005)
        sock.sendall(encode(request))
        length = frame_length(_receive_exactly(sock, _HEADER.size))
        return decode(_receive_exactly(sock, length))
    finally:
        sock.close()
