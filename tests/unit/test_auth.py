"""The job's secret, the handshake, the per-message MAC, and the local lane's limits
(checked before allocation) over a socket pair."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import struct
import tracemalloc
from pathlib import Path

import pytest

from trimtab.errors import ConfigError
from trimtab.transport.auth import (
    AuthRefused,
    ClientHandshake,
    JobKey,
    ServerHandshake,
    Session,
    auth_from_env,
    make_secret_file,
    read_secret_file,
)
from trimtab.transport.lane import LaneConnection, LaneRefused
from trimtab.transport.limits import Limits


def pair(client_key: JobKey, server_key: JobKey) -> tuple[Session, Session]:
    client, server = ClientHandshake(client_key), ServerHandshake(server_key)
    proof, client_session = client.on_challenge(server.on_hello(client.hello))
    return client_session, server.on_proof(proof)


def test_a_good_secret_opens_a_session_both_ways() -> None:
    key = JobKey(secrets.token_bytes(32))
    c, s = pair(key, key)
    sent = c.seal([b"header", b"payload"])
    got = s.open([memoryview(bytes(f)) for f in sent])
    assert [bytes(f) for f in got] == [b"header", b"payload"]
    back = s.seal([b"reply"])
    assert bytes(c.open([memoryview(bytes(back[0]))])[0]) == b"reply"


def test_a_wrong_secret_is_refused_on_either_side() -> None:
    key, other = JobKey(secrets.token_bytes(32)), JobKey(secrets.token_bytes(32))
    client, server = ClientHandshake(other), ServerHandshake(key)
    with pytest.raises(AuthRefused, match="does not hold"):
        client.on_challenge(server.on_hello(client.hello))  # the client refuses an impostor
    client, server = ClientHandshake(key), ServerHandshake(key)
    challenge = server.on_hello(client.hello)
    evil = ClientHandshake(other)
    with pytest.raises(AuthRefused):
        server.on_proof(evil.hello)  # not a proof at all
    with pytest.raises(AuthRefused):
        server.on_proof(b"TTPROF01" + bytes(32))  # a proof without the secret
    assert client.on_challenge(challenge)  # the real client still gets in
    with pytest.raises(AuthRefused):
        ServerHandshake(key).on_hello(b"\x01\x00\x00\x00" + bytes(36))  # lane framing


def test_replayed_modified_reordered_and_foreign_messages_are_refused() -> None:
    key = JobKey(secrets.token_bytes(32))
    c, s = pair(key, key)
    first, second = c.seal([b"one"]), c.seal([b"two", b"xx"])
    m2 = [memoryview(bytes(f)) for f in second]
    assert bytes(s.open(m2)[0]) == b"two"
    with pytest.raises(AuthRefused, match="replayed or reordered"):
        s.open([memoryview(bytes(first[0]))])  # older than one already seen
    with pytest.raises(AuthRefused, match="replayed or reordered"):
        s.open(m2)  # the same again
    third = bytearray(c.seal([b"three"])[0])
    third[0] ^= 1
    with pytest.raises(AuthRefused, match="MAC"):
        s.open([memoryview(bytes(third))])  # modified header
    fourth = c.seal([b"four", b"abc"])
    with pytest.raises(AuthRefused, match="MAC"):
        s.open([memoryview(bytes(fourth[0])), memoryview(b"ab")])  # truncated payload
    with pytest.raises(AuthRefused, match="MAC"):
        s.open([memoryview(bytes(s.seal([b"reflected"])[0]))])  # its own, reflected
    other = JobKey(secrets.token_bytes(32))
    oc, _ = pair(other, other)
    with pytest.raises(AuthRefused, match="MAC"):
        s.open([memoryview(bytes(oc.seal([b"another job"])[0]))])
    with pytest.raises(AuthRefused, match="no MAC"):
        s.open([memoryview(b"short")])


def test_a_seal_is_the_documented_keyed_blake2b_with_one_two_and_three_frames() -> None:
    # The trailer is <Q seq, then BLAKE2b(key=direction key, digest_size=16)(seq | header |
    # <nQ lengths of the frames after it) (docs/security.md), as hashlib computes it from
    # scratch, not from the session's copied state; the two-frame case packed without a
    # list.
    import hashlib

    send, recv = secrets.token_bytes(32), secrets.token_bytes(32)
    c, s = Session(send, recv), Session(recv, send)
    for seq, frames in enumerate(
        [[b"head"], [b"head2", memoryview(b"x" * 70000)], [b"h3", b"ab", bytearray(b"cde")]], 1
    ):
        sealed = c.seal(frames)
        lengths = [memoryview(f).nbytes for f in frames[1:]]
        packed = struct.pack(f"<{len(lengths)}Q", *lengths) if lengths else b""
        want = hashlib.blake2b(
            struct.pack("<Q", seq) + bytes(frames[0]) + packed, key=send, digest_size=16
        ).digest()
        assert bytes(sealed[0]) == bytes(frames[0]) + struct.pack("<Q", seq) + want
        assert sealed[1:] == frames[1:]
        opened = s.open([memoryview(bytes(f)) for f in sealed])
        assert [bytes(f) for f in opened] == [bytes(f) for f in frames]
    with pytest.raises(AuthRefused, match="MAC"):  # a payload's length is MACed, 2 frames too
        s.open([memoryview(bytes(c.seal([b"h", b"abc"])[0])), memoryview(b"abcd")])


def test_the_secret_file_must_be_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_secret_file(tmp_path)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert len(read_secret_file(path)) == 32
    with pytest.raises(FileExistsError):
        make_secret_file(tmp_path)  # never overwritten
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_secret_file(path)
    with pytest.raises(ConfigError, match="--secret-file"):
        read_secret_file(tmp_path / "missing")
    short = tmp_path / "short"
    short.write_bytes(b"x" * 5)
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="not a 32-byte secret"):
        read_secret_file(short)
    with pytest.raises(ConfigError, match="TRIMTAB_SECRET_FILE"):
        auth_from_env({})
    assert auth_from_env({"TRIMTAB_AUTH": "0"}) is None
    os.chmod(path, 0o600)
    key = auth_from_env({"TRIMTAB_SECRET_FILE": str(path), "TRIMTAB_ENCRYPT": "1"})
    assert key is not None and key.encrypt


def lane_pair(
    limits: Limits, key: JobKey | None = None
) -> tuple[socket.socket, LaneConnection, LaneConnection | None]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = LaneConnection(b, b"i:x", limits, ServerHandshake(key) if key else None)
    client = LaneConnection(a, b"o:x", limits, ClientHandshake(key)) if key else None
    return a, server, client


@pytest.mark.parametrize(
    "claim",
    [
        struct.pack("<IQ", 1, 1 << 50),
        struct.pack("<I1024Q", 1024, *([64 << 20] * 1024)),
        struct.pack("<IQ", 1, 512 << 20),
    ],
    ids=["2^50 bytes", "1024 frames of 64 MiB", "512 MiB never sent"],
)
@pytest.mark.parametrize("authenticated", [False, True])
def test_the_lanes_claims_close_the_connection_before_allocating(
    claim: bytes, authenticated: bool
) -> None:
    key = JobKey(secrets.token_bytes(32)) if authenticated else None
    raw, server, _ = lane_pair(Limits.for_job(1 << 20), key)
    raw.sendall(claim)
    tracemalloc.start()
    try:
        with pytest.raises(LaneRefused):
            server.read(memoryview(bytearray(1 << 18)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # nothing of the claimed size was allocated
    raw.close()
    server.close()


def test_an_authenticated_lane_carries_messages_and_refuses_over_the_limits() -> None:
    key = JobKey(secrets.token_bytes(32))
    limits = Limits(max_frame_bytes=1000, max_frames=3, max_message_bytes=1500)
    _, server, client = lane_pair(limits, key)
    assert client is not None
    scratch = memoryview(bytearray(1 << 16))
    client.send([b"queued before the handshake", b"p" * 100])
    got: list[list[memoryview]] = []
    for _ in range(3):  # HELLO -> CHALLENGE -> PROOF and the queued message
        messages, closed = server.read(scratch)
        assert not closed
        got += messages
        client.read(scratch)
    assert [[bytes(f) for f in m] for m in got] == [[b"queued before the handshake", b"p" * 100]]
    client.send([b"h", b"x" * 900, b"y" * 900])  # 1800 bytes: over max_message_bytes
    with pytest.raises(LaneRefused, match="at most 1500"):
        server.read(scratch)


def test_a_job_without_authentication_still_gets_a_server_key_for_servers_added_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a secret, the coordinator and servers derive the server key from it and the
    launcher passes none; without one (--no-auth), the launcher makes one for the job,
    the same for every process, so that `trimtab scale` can still add a server."""
    from trimtab.launch import env as envvars
    from trimtab.launch.job import Job, LaunchConfig

    monkeypatch.delenv(envvars.SERVER_KEY, raising=False)
    secure = Job(LaunchConfig(workers=1, servers=1), ["true"])
    secure._make_secret()
    try:
        assert envvars.SERVER_KEY not in secure._role_env()
    finally:
        assert secure._secret_dir is not None
        shutil.rmtree(secure._secret_dir)
    open_job = Job(LaunchConfig(workers=1, servers=1, no_auth=True), ["true"])
    open_job._make_secret()
    first, second = open_job._role_env(), open_job._role_env()
    assert len(bytes.fromhex(first[envvars.SERVER_KEY])) == 32
    assert first[envvars.SERVER_KEY] == second[envvars.SERVER_KEY]
    assert first[envvars.AUTH] == "0"


def test_after_its_handshake_a_lane_carries_messages_without_a_mac() -> None:
    """A connected Unix stream has two proven ends and nothing can be injected into it:
    once the handshake is done, a message goes as its framing alone (no 24-byte
    trailer per header to seal and check), and arrives as sent."""
    key = JobKey(secrets.token_bytes(32))
    _, server, client = lane_pair(Limits.for_job(1 << 20), key)
    assert client is not None
    scratch = memoryview(bytearray(1 << 16))
    for _ in range(3):  # HELLO -> CHALLENGE -> PROOF
        server.read(scratch)
        client.read(scratch)
    assert client.proven and server.proven
    client.send([b"head", b"body!"])
    raw = server.sock.recv(1 << 10)
    assert raw == struct.pack("<I2Q", 2, 4, 5) + b"head" + b"body!"
    client.send([b"again", b""])
    messages, closed = server.read(scratch)
    assert not closed and [[bytes(f) for f in m] for m in messages] == [[b"again", b""]]
