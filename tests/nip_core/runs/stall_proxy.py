"""A TCP proxy on loopback that can slow down or stall the traffic to a server (tests only).

Put in front of moto's S3 server, it makes a real slow or unreachable object store: each
chunk a client sends is forwarded after ``delay_s`` seconds, and while ``stalled`` is set
nothing is forwarded at all (connections stay open, requests go unanswered), like a
network partition in which packets are dropped rather than refused.
"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit


class StallProxy:
    def __init__(self, target_url: str):
        parts = urlsplit(target_url)
        self.target = (parts.hostname, parts.port)
        self.delay_s = 0.0
        self.stalled = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._track(client)
            self._track(server)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    while self.stalled.is_set():
                        if self._closed.wait(0.05):
                            return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()
