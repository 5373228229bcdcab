"""Helpers for the admin console tests: a `websockets` client that reads the console's messages, and a
raw WebSocket client that never reads (the stalled console)."""
import base64
import json
import os
import socket
import struct
import time

from websockets.sync.client import connect


def ws_url(server, port=None):
    host, base_port = server.base.removeprefix("http://").split(":")
    return f"ws://{host}:{port or base_port}/admin/ws"


class Console:
    """One admin console over `websockets` (sync client): send commands, wait for messages by type."""

    def __init__(self, server, token=None, port=None, **kw):
        headers = {"Authorization": f"Bearer {token}"} if token else None
        # Entered as a context manager (websockets 17.1 deprecates a bare connect()); close() leaves it.
        self.ws = connect(ws_url(server, port), additional_headers=headers, open_timeout=10, **kw).__enter__()
        self.seen = []
        self.next_id = 1

    def recv(self, timeout=10):
        m = json.loads(self.ws.recv(timeout=timeout))
        self.seen.append(m)
        return m

    def wait(self, pred, timeout=10):
        """The first message (from now) for which pred(m) holds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no such message within {timeout} s; last ones: {self.seen[-3:]}"
            m = self.recv(timeout=left)
            if pred(m):
                return m

    def send(self, obj):
        self.ws.send(json.dumps(obj) if not isinstance(obj, str) else obj)

    def command(self, cmd, **fields):
        """Sends a command with a fresh id; returns its ack or error."""
        i = self.next_id
        self.next_id += 1
        self.send({"cmd": cmd, "id": i, **fields})
        return self.wait(lambda m: m.get("type") in ("ack", "error") and m.get("id") == i)

    def close(self):
        self.ws.close()


class StalledConsole:
    """A WebSocket client that asks for updates and then never reads: a tiny receive buffer, the
    upgrade done by hand, frames masked as a client must."""

    def __init__(self, server, hz=20):
        host, port = server.base.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /admin/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)  # byte by byte: nothing after the headers is read
        assert head.startswith(b"HTTP/1.1 101"), head
        self.send({"cmd": "rate", "hz": hz})

    def send(self, obj):
        data = json.dumps(obj).encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n))
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def dropped(self):
        """True once the server has closed the connection (a send fails or the peer reset it)."""
        try:
            self.sock.setblocking(False)
            self.send({"cmd": "ping"})
            return False
        except OSError:
            return True
        finally:
            self.sock.setblocking(True)

    def close(self):
        self.sock.close()
