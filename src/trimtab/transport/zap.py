"""libzmq's own gate (ZAP): a TCP connection without the job's credentials is refused
in ZeroMQ's handshake, before any of its messages is read or queued.

A :class:`ZapHandler` answers libzmq's authentication requests for one ZeroMQ context
(``inproc://zeromq.zap.01``): under PLAIN, the password must be the job's derived token;
under CURVE (``--encrypt``), the client's public key must be the job's derived client
key. Our own handler rather than ``zmq.auth``'s: it compares in constant time, logs no
password, and runs no event loop.
"""

from __future__ import annotations

import hmac
import logging
import threading

import zmq
from zmq.utils import z85

from trimtab.transport.auth import JobKey

log = logging.getLogger("trimtab.transport")

_ENDPOINT = "inproc://zeromq.zap.01"
_DOMAIN = b"trimtab"
_USER = b"trimtab"


def secure_server(sock: zmq.Socket[bytes], key: JobKey) -> None:
    """Make a binding socket demand the job's credentials. Never blocks."""
    sock.setsockopt(zmq.ZAP_DOMAIN, _DOMAIN)
    if key.encrypt:
        _, secret = key.curve_keys(b"server")
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    else:
        sock.setsockopt(zmq.PLAIN_SERVER, 1)


def secure_client(sock: zmq.Socket[bytes], key: JobKey) -> None:
    """Give a connecting socket the job's credentials. Never blocks."""
    if key.encrypt:
        server_public, _ = key.curve_keys(b"server")
        public, secret = key.curve_keys(b"client")
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    else:
        sock.setsockopt(zmq.PLAIN_USERNAME, _USER)
        sock.setsockopt(zmq.PLAIN_PASSWORD, key.zap_token)


class ZapHandler:
    """Answers a context's ZAP requests in a thread of its own until :meth:`stop`.
    Construct (binds, starts the thread) before any socket of the context binds.
    Thread-safe; :meth:`stop` blocks up to a poll interval."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], key: JobKey) -> None:
        self._token = key.zap_token
        self._client_key = z85.decode(key.curve_keys(b"client")[0])
        self._sock: zmq.Socket[bytes] = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(_ENDPOINT)
        self._stop = threading.Event()
        #: Connections refused (for tests and the log).
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="trimtab-zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(200):
                    continue
                request = self._sock.recv_multipart()
                self._sock.send_multipart(self._answer(request))
        except zmq.ZMQError:  # the context is ending
            pass
        finally:
            self._sock.close()

    def _answer(self, request: list[bytes]) -> list[bytes]:
        rid = request[1] if len(request) > 1 else b""
        ok = False
        if len(request) >= 6 and request[0] == b"1.0":
            mechanism, credentials = request[5], request[6:]
            if mechanism == b"PLAIN" and len(credentials) == 2:
                ok = credentials[0] == _USER and hmac.compare_digest(credentials[1], self._token)
            elif mechanism == b"CURVE" and len(credentials) == 1:
                ok = hmac.compare_digest(credentials[0], self._client_key)
        if not ok:
            self.refused += 1
            level = logging.WARNING if self.refused == 1 else logging.DEBUG
            address = request[3].decode(errors="replace") if len(request) > 3 else "?"
            log.log(level, "refused a connection from %s without this job's secret", address)
            return [b"1.0", rid, b"400", b"not a member of this job", b"", b""]
        return [b"1.0", rid, b"200", b"OK", b"member", b""]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


class SharedContext:
    """A ZeroMQ context shared by a transport and its companions: one ZeroMQ I/O thread
    per process, terminated when the last of them closes, and its ZAP handler (with a
    key). Thread-safe."""

    def __init__(self, key: JobKey | None) -> None:
        self.ctx = zmq.Context()
        self.key = key
        self.zap: ZapHandler | None = None
        self._users = 0
        self._lock = threading.Lock()

    def gate(self) -> None:
        """Start the ZAP handler (with a key), before a socket of the context binds."""
        with self._lock:
            if self.key is not None and self.zap is None:
                self.zap = ZapHandler(self.ctx, self.key)

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            if self.zap is not None:
                self.zap.stop()
            self.ctx.term()  # every socket is closed by now, so this does not block
