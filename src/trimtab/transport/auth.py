"""The job's secret, and how every connection proves it.

Threat model. Anyone on the machine can find a job's addresses and id (``ps``, ``ss``);
only the job's own processes can read its secret: 32 random bytes in a file of mode
0600 (``trimtab run`` makes one in a private 0700 directory and removes it at the end;
``trimtab coordinator`` makes one for a job started by hand). The other roles take its
path by ``--secret-file`` or ``TRIMTAB_SECRET_FILE``, never the secret itself on a command
line. A process without the secret:

- cannot get past a connection's handshake: until a peer has proven the secret, a
  node accepts only a handshake message of fixed size (:data:`HELLO_BYTES`,
  :data:`PROOF_BYTES`); anything else closes that connection (local lane) or is dropped
  unparsed (ZeroMQ), and is counted. Over TCP, libzmq itself refuses the connection
  first (ZAP: PLAIN with a token derived from the secret, or CURVE with keys derived
  from it under ``--encrypt``), so an outsider's frames are never queued;
- cannot forge, replay, reorder or redirect a message: each header carries a MAC under
  the connection's session key and direction, over the header, a sequence number and
  the lengths of the frames after it (:class:`Session`);
- can, if on the path between two hosts, read and modify the *payload* frames (tensor
  bytes) of an unencrypted job: they are not MACed (a keyed pass over every byte cost
  more than the whole step's budget, docs/security.md). ``--encrypt`` (ZeroMQ CURVE)
  closes that. The local lane and shared memory never leave the machine.

The handshake (both sides hold the secret ``K``; ``cn``, ``sn`` are 32-byte nonces)::

    client -> server  HELLO      "TTHELO01" cn                           40 bytes
    server -> client  CHALLENGE  "TTCHAL01" sn HMAC(K, "server"|cn|sn)   72 bytes
    client -> server  PROOF      "TTPROF01" HMAC(K, "client"|cn|sn)      40 bytes

Each side checks the other's HMAC (so a client never talks to an impostor either), and
both derive ``S = HMAC(K, "session"|cn|sn)`` and a key per direction from it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import zmq
from zmq.utils import z85

from trimtab.errors import ConfigError
from trimtab.transport.base import Frame

__all__ = [
    "AUTH_ENV",
    "CHALLENGE_BYTES",
    "ENCRYPT_ENV",
    "HELLO_BYTES",
    "PROOF_BYTES",
    "SECRET_BYTES",
    "SECRET_FILE_ENV",
    "TRAILER_BYTES",
    "AuthRefused",
    "ClientHandshake",
    "JobKey",
    "ServerHandshake",
    "Session",
    "auth_from_env",
    "make_secret_file",
    "read_secret_file",
]

#: Bytes of a job's secret.
SECRET_BYTES = 32
#: The path of the job's secret file, for a role started by hand and for workers.
SECRET_FILE_ENV = "TRIMTAB_SECRET_FILE"
#: ``0``: no authentication (INSECURE: any local user can corrupt or stop the job; for
#: benchmarks that compare, never for a job that matters).
AUTH_ENV = "TRIMTAB_AUTH"
#: ``1``: TCP connections are encrypted (ZeroMQ CURVE), as ``--encrypt`` asks.
ENCRYPT_ENV = "TRIMTAB_ENCRYPT"

_NONCE = 32
_MAC = 32
_HELLO = b"TTHELO01"
_CHALLENGE = b"TTCHAL01"
_PROOF = b"TTPROF01"
HELLO_BYTES = len(_HELLO) + _NONCE
CHALLENGE_BYTES = len(_CHALLENGE) + _NONCE + _MAC
PROOF_BYTES = len(_PROOF) + _MAC
#: Bytes of a message's tag (keyed BLAKE2b's output length, :class:`Session`).
TAG_BYTES = 16
#: What :meth:`Session.seal` appends to a header: ``<Q`` sequence number, 16-byte tag.
TRAILER_BYTES = 8 + TAG_BYTES
_SEQ = struct.Struct("<Q")
_SEQ_PACK = _SEQ.pack

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class _Mac(Protocol):
    """A keyed MAC state (:func:`hashlib.blake2b` with a key)."""

    def copy(self) -> _Mac: ...
    def update(self, msg: ReadableBuffer, /) -> None: ...
    def digest(self) -> bytes: ...


class AuthRefused(Exception):
    """A peer failed the handshake, or a message failed its MAC check: the connection
    (or the message) is refused. Never reaches the roles."""


def make_secret_file(directory: Path, name: str = "secret") -> Path:
    """Write a fresh secret to ``directory/name``, created exclusively with mode 0600
    (refused if it exists); return its path. Never blocks; raises ``OSError``."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
    finally:
        os.close(fd)
    return path


def read_secret_file(path: str | Path) -> bytes:
    """The secret in ``path``. Raises :class:`ConfigError` saying what to do if the file
    is missing or unreadable, readable by group or others, or not a secret."""
    hint = (
        "give every role of the job the file `trimtab run` or `trimtab coordinator` "
        f"made, by --secret-file or {SECRET_FILE_ENV}"
    )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the job's secret file {path}: {exc.strerror}; {hint}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"the job's secret file {path} is not a regular file; {hint}")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"the job's secret file {path} has mode {stat.S_IMODE(info.st_mode):o}: "
                f"others could read it; run `chmod 600 {path}` (or make a new one)"
            )
        if info.st_uid != os.geteuid():
            raise ConfigError(f"the job's secret file {path} belongs to another user; {hint}")
        secret = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != SECRET_BYTES:
        raise ConfigError(
            f"{path} holds {len(secret)} bytes, not a {SECRET_BYTES}-byte secret; {hint}"
        )
    return secret


def auth_from_env(
    environ: Mapping[str, str], secret_file: str | None = None, *, encrypt: bool = False
) -> JobKey | None:
    """The job's key from ``secret_file`` (a flag's value) or ``TRIMTAB_SECRET_FILE``,
    encrypting with ``encrypt`` or ``TRIMTAB_ENCRYPT=1``; ``None`` if ``TRIMTAB_AUTH=0``
    (insecure). For the edges. Raises :class:`ConfigError` if no secret file is named,
    or as :func:`read_secret_file`."""
    if environ.get(AUTH_ENV, "1") == "0":
        return None
    path = secret_file or environ.get(SECRET_FILE_ENV)
    if not path:
        raise ConfigError(
            f"no secret for this job: pass --secret-file PATH or set {SECRET_FILE_ENV} to the "
            "file `trimtab run` or `trimtab coordinator` made (or TRIMTAB_AUTH=0 to run "
            "without authentication, which lets any local user corrupt or stop the job)"
        )
    encrypt = encrypt or environ.get(ENCRYPT_ENV, "0") == "1"
    return JobKey(read_secret_file(path), encrypt=encrypt)


class JobKey:
    """A job's secret and the keys derived from it. Immutable; thread-safe.

    Args:
        secret: the job's :data:`SECRET_BYTES` bytes.
        encrypt: TCP connections use ZeroMQ CURVE (authenticated encryption, keys
            derived from the secret) instead of PLAIN.
    """

    def __init__(self, secret: bytes, *, encrypt: bool = False) -> None:
        if len(secret) != SECRET_BYTES:
            raise ConfigError(f"a job secret has {SECRET_BYTES} bytes, not {len(secret)}")
        self._secret = secret
        self.encrypt = encrypt

    def derive(self, label: bytes) -> bytes:
        """32 bytes for ``label``, derived from the secret. Never blocks."""
        return hmac.digest(self._secret, b"trimtab/1 " + label, "sha256")

    @property
    def zap_token(self) -> bytes:
        """The PLAIN password ZeroMQ's handshake carries (a derived token: it travels in
        clear, and proves nothing the app-level handshake must)."""
        return self.derive(b"zap").hex().encode()

    def curve_keys(self, role: bytes) -> tuple[bytes, bytes]:
        """The (public, secret) Z85 CURVE keypair of ``role`` (b"server" or b"client")."""
        secret_z85 = z85.encode(self.derive(b"curve " + role))
        return zmq.curve_public(secret_z85), secret_z85

    def mac(self, label: bytes, *parts: bytes) -> bytes:
        return hmac.digest(self._secret, b"".join((label, *parts)), "sha256")


class ClientHandshake:
    """The connecting side's handshake: :attr:`hello` to send, then
    :meth:`on_challenge`. Not thread-safe; never blocks."""

    def __init__(self, key: JobKey) -> None:
        self._key = key
        self._cn = secrets.token_bytes(_NONCE)
        self.hello = _HELLO + self._cn
        #: The first bytes of the message this side waits for.
        self.expected_magic = _CHALLENGE

    def on_challenge(self, message: bytes | memoryview) -> tuple[bytes, Session]:
        """Check the server's CHALLENGE; return the PROOF to send and the session.
        Raises :class:`AuthRefused` if the server does not hold the secret."""
        message = bytes(message)
        if len(message) != CHALLENGE_BYTES or not message.startswith(_CHALLENGE):
            raise AuthRefused("the peer answered the handshake with something else")
        sn = message[8 : 8 + _NONCE]
        if not hmac.compare_digest(message[8 + _NONCE :], self._key.mac(b"server", self._cn, sn)):
            raise AuthRefused("the peer does not hold this job's secret")
        proof = _PROOF + self._key.mac(b"client", self._cn, sn)
        return proof, _session(self._key, self._cn, sn, client=True)


class ServerHandshake:
    """The accepting side's handshake: :meth:`on_hello` answers a HELLO, then
    :meth:`on_proof` checks the PROOF. Not thread-safe; never blocks."""

    def __init__(self, key: JobKey) -> None:
        self._key = key
        self._sn = secrets.token_bytes(_NONCE)
        self._cn = b""

    @property
    def hello_seen(self) -> bool:
        return bool(self._cn)

    @property
    def expected_magic(self) -> bytes:
        """The first bytes of the message this side waits for."""
        return _PROOF if self._cn else _HELLO

    def on_hello(self, message: bytes | memoryview) -> bytes:
        """The CHALLENGE answering a HELLO. Raises :class:`AuthRefused` for anything else."""
        message = bytes(message)
        if len(message) != HELLO_BYTES or not message.startswith(_HELLO) or self._cn:
            raise AuthRefused("a connection began with something other than the handshake")
        self._cn = message[8:]
        return _CHALLENGE + self._sn + self._key.mac(b"server", self._cn, self._sn)

    def on_proof(self, message: bytes | memoryview) -> Session:
        """The session, if ``message`` proves the secret. Raises :class:`AuthRefused`."""
        message = bytes(message)
        if len(message) != PROOF_BYTES or not message.startswith(_PROOF) or not self._cn:
            raise AuthRefused("a connection did not complete the handshake")
        if not hmac.compare_digest(message[8:], self._key.mac(b"client", self._cn, self._sn)):
            raise AuthRefused("a peer does not hold this job's secret")
        return _session(self._key, self._cn, self._sn, client=False)


def _session(key: JobKey, cn: bytes, sn: bytes, *, client: bool) -> Session:
    base = key.mac(b"session", cn, sn)
    c2s = hmac.digest(base, b"client to server", "sha256")
    s2c = hmac.digest(base, b"server to client", "sha256")
    return Session(c2s, s2c) if client else Session(s2c, c2s)


class Session:
    """One authenticated connection's message MACs.

    :meth:`seal` appends to a message's header frame ``<Q`` sequence number and the tag
    BLAKE2b(key=direction key, digest_size=16)(seq | header | ``<nQ`` lengths of the
    frames after it): BLAKE2b's keyed mode (RFC 7693 section 2.5), a MAC under the 32-byte
    direction key, its 16-byte output length set in the parameter block (not a truncated
    longer digest); :meth:`open` checks it in constant time and strips it. Sequence
    numbers rise strictly per direction (gaps allowed: ZeroMQ may drop at its high-water
    mark), so a replayed or reordered message is refused; the keys are per connection
    and direction, so a message of another connection, direction or job is refused too.

    Cost: one copy of a keyed BLAKE2b state (its key block is hashed once, here) and
    short updates per message: about 0.35 us a MAC here, against 0.8 for OpenSSL's
    HMAC-SHA256 state copied the same way (docs/security.md). Not thread-safe: its
    transport's thread.
    """

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        self._send = _keyed(send_key)
        self._recv = _keyed(recv_key)
        self._sent = 0
        self._seen = 0

    def seal(self, frames: Sequence[Frame]) -> list[Frame]:
        """``frames`` with the header's trailer appended (a copy of the header only).
        Never blocks."""
        self._sent += 1
        seq = _SEQ_PACK(self._sent)
        mac = self._send.copy()
        mac.update(seq)
        head = frames[0]
        mac.update(head)
        n = len(frames)
        if n == 2:  # (a header and a payload: _lengths without its list)
            mac.update(_SEQ_PACK(memoryview(frames[1]).nbytes))
        elif n > 2:
            mac.update(_lengths(frames))
        return [b"".join((head, seq, mac.digest())), *frames[1:]]

    def open(self, frames: list[memoryview]) -> list[memoryview]:
        """``frames`` with the header's trailer checked and stripped (no copy). Raises
        :class:`AuthRefused` for a message without a valid, fresh MAC. Never blocks."""
        head = frames[0]
        size = head.nbytes
        if size < TRAILER_BYTES:
            raise AuthRefused(f"a message of {size} header bytes carries no MAC")
        seq_at = size - TRAILER_BYTES
        (seq,) = _SEQ.unpack_from(head, seq_at)
        mac = self._recv.copy()
        mac.update(head[seq_at : seq_at + 8])
        mac.update(head[:seq_at])
        n = len(frames)
        if n == 2:
            mac.update(_SEQ_PACK(frames[1].nbytes))
        elif n > 2:
            mac.update(_lengths(frames))
        if not hmac.compare_digest(mac.digest(), head[seq_at + 8 :]):
            raise AuthRefused("a message's MAC does not match (forged, or another job's)")
        if seq <= self._seen:
            raise AuthRefused(f"a replayed or reordered message (#{seq} after #{self._seen})")
        self._seen = seq
        if n == 2:
            return [head[:seq_at], frames[1]]
        return [head[:seq_at], *frames[1:]]


def _keyed(key: bytes) -> _Mac:
    """BLAKE2b keyed with ``key`` (32 bytes), 16-byte tags; to be copied per message."""
    return hashlib.blake2b(key=key, digest_size=TAG_BYTES)


def _lengths(frames: Sequence[Frame]) -> bytes:
    sizes = [memoryview(f).nbytes for f in frames[1:]]
    return struct.pack(f"<{len(sizes)}Q", *sizes)
