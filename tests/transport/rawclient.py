"""A WebSocket client on a plain blocking socket, for clients that misbehave at the TCP level.

It can stop reading altogether (nothing drains its socket; its receive buffer is kept small),
send a text frame that is not UTF-8, or vanish with a RST. The WebSocket framing is websockets'
sans-I/O client. `server_socket_open` tells, from the kernel's table, whether the relay's end of
a connection still exists.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.uri import parse_uri

from buzz.nostr import Signer

AUTH_KIND = 22242


class RawClient:
    def __init__(self, port: int, host: str, *, rcvbuf: int = 4096) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Set before connect so the window is small from the start: the kernel soaks up little for us.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.local_port: int = self.sock.getsockname()[1]
        self.sock.settimeout(10.0)
        self.relay_url = f"ws://{host}/"
        self.proto = ClientProtocol(parse_uri(self.relay_url), max_size=None)
        self.proto.send_request(self.proto.connect())
        self._flush()
        self._messages: list[Any] = []
        self.close_code: int | None = None
        self._read_until(lambda: self.proto.handshake_exc is not None or self._opened())
        if self.proto.handshake_exc is not None:
            raise self.proto.handshake_exc

    def _opened(self) -> bool:
        return self.proto.state.name == "OPEN"

    def _flush(self) -> None:
        for data in self.proto.data_to_send():
            if data:
                self.sock.sendall(data)

    def _read_until(self, done: Any) -> None:
        while not done():
            data = self.sock.recv(65536)
            self.proto.receive_data(data)
            if not data:
                raise ConnectionError("the relay closed the connection")
            for event in self.proto.events_received():
                if isinstance(event, Frame):
                    if event.opcode == Opcode.TEXT:
                        self._messages.append(json.loads(bytes(event.data)))
                    elif event.opcode == Opcode.CLOSE:
                        self.close_code = struct.unpack("!H", event.data[:2])[0] if len(event.data) >= 2 else 1005
            self._flush()

    def send_json(self, message: Any) -> None:
        self.send_text(json.dumps(message, separators=(",", ":")).encode())

    def send_text(self, data: bytes) -> None:
        self.proto.send_text(data)
        self._flush()

    def expect(self, verb: str) -> list[Any]:
        def found() -> bool:
            return any(m[0] == verb for m in self._messages) or self.close_code is not None

        self._read_until(found)
        for index, message in enumerate(self._messages):
            if message[0] == verb:
                return list(self._messages.pop(index))
        raise ConnectionError(f"closed with {self.close_code} before {verb}")

    def wait_close(self) -> int | None:
        """Read (discarding messages) until the relay's close frame or the end of the stream."""
        with contextlib.suppress(OSError):  # the stream ended, or was reset
            self._read_until(lambda: self.close_code is not None)
        return self.close_code

    def auth(self, signer: Signer) -> list[Any]:
        challenge = self.expect("AUTH")[1]
        event = signer.sign_event(
            kind=AUTH_KIND, tags=[["relay", self.relay_url], ["challenge", challenge]], content=""
        ).to_dict()
        self.send_json(["AUTH", event])
        return self.expect("OK")

    def vanish(self) -> None:
        """Close with a RST (SO_LINGER 0), as a client whose machine dropped off the network looks."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


# /proc/net/tcp states after which a socket is closed for good: TIME_WAIT, CLOSE.
_CLOSED_STATES = frozenset({"06", "07"})


def server_socket_open(server_port: int, client_port: int) -> bool:
    """Whether the server's end of a connection (local server_port, remote client_port) is still open:
    in the kernel's table in a state other than TIME_WAIT / CLOSE. An aborted socket leaves the table."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if _port(fields[1]) == server_port and _port(fields[2]) == client_port:
            return fields[3] not in _CLOSED_STATES
    return False


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return bool(predicate())
