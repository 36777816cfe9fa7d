"""The ZeroMQ transport over real loopback sockets, and its local lane (Unix sockets)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from trimtab.transport import Envelope, Peer, ZmqTransport, lane
from trimtab.transport.zmq import lane_from_env

# One process binds, one connects; the receiver holds a round's 16 frames of 2 MiB, then
# drops them all (as a worker does once a step's values are copied into the parameters),
# and counts its minor page faults over the later rounds.
_RECEIVE = textwrap.dedent(
    """
    import json, resource, sys
    from trimtab.transport import ZmqTransport
    reuse = sys.argv[1] == "1"
    server = ZmqTransport(bind=True, reuse_buffers=reuse, lane=False)
    client = ZmqTransport(bind=False, reuse_buffers=reuse, lane=False)
    peer = client.connect(server.address)
    payload = bytes(2 << 20)
    faults = 0
    for round_ in range(6):
        held = []
        for _ in range(16):
            client.send(peer, [b"h", payload])
            env = None
            while env is None:
                env = server.recv(10.0)
            assert env.frames[1].nbytes == len(payload)
            held.append(env)
        del held, env
        if round_ == 2:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    client.close()
    server.close()
    print(json.dumps({"faults": faults}))
    """
)


def _faults(reuse: bool) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _RECEIVE, "1" if reuse else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(json.loads(out.stdout.strip().splitlines()[-1])["faults"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc allocator tuning")
def test_received_frames_reuse_freed_memory() -> None:
    # 3 rounds of 32 MiB are 24,576 pages: fresh buffers fault on nearly every one of
    # them, reused ones on almost none.
    fresh = _faults(reuse=False)
    reused = _faults(reuse=True)
    assert fresh > 10_000, fresh
    assert reused < fresh / 10, (reused, fresh)


# -- the local lane -------------------------------------------------------------------

lane_only = pytest.mark.skipif(not lane.supported(), reason="abstract Unix sockets are Linux's")


def _recv(
    transport: ZmqTransport, sender: ZmqTransport | None = None, timeout_s: float = 10.0
) -> Envelope:
    """The next message ``transport`` receives; meanwhile ``sender`` polls too, as every
    node does while it waits (a lane message the kernel could not take at once leaves
    during its sender's polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sender is not None:
            assert sender.recv(0) is None
        env = transport.recv(0.05)
        if env is not None:
            return env
    raise AssertionError("nothing arrived")


@pytest.fixture
def pair() -> Iterator[tuple[ZmqTransport, ZmqTransport, Peer]]:
    """A bound transport, one connected to it over the lane, and its name for the first."""
    server = ZmqTransport(bind=True, lane=True)
    client = ZmqTransport(bind=False, lane=True)
    yield server, client, client.connect(server.address)
    client.close()
    server.close()


@lane_only
def test_local_peers_talk_over_the_lane_in_order_both_ways(
    pair: tuple[ZmqTransport, ZmqTransport, Peer],
) -> None:
    server, client, peer = pair
    assert client.through_lane(peer)
    big = bytes(range(256)) * (12 << 10)  # 3 MiB: received straight into its own buffer
    messages = [[b"h0"], [b"h1", b""], [b"h2", b"x" * 1024, big], [b"h3", memoryview(big)[5:9]]]
    for frames in messages:
        client.send(peer, frames)
    got = [_recv(server, client) for _ in messages]
    for env, frames in zip(got, messages, strict=True):
        assert [bytes(f) for f in env.frames] == [bytes(f) for f in frames]
    back = got[0].peer
    assert back.startswith(b"i:") and server.through_lane(back)
    server.send(back, [b"reply", big])
    env = _recv(client, server)
    assert env.peer == peer and bytes(env.frames[1]) == big
    # Frames are writable buffers of their own (torch.frombuffer takes them as is).
    env.frames[1][0] = 7


@lane_only
def test_the_lane_queues_what_the_kernel_cannot_take_without_blocking(
    pair: tuple[ZmqTransport, ZmqTransport, Peer],
) -> None:
    server, client, peer = pair
    client.send(peer, [b"hello"])
    back = _recv(server).peer
    # Both sides send far more than the kernel buffers before either reads: no send may
    # block (that would deadlock two processes doing the same), and nothing is lost.
    block = bytes(1 << 20)
    for i in range(40):
        client.send(peer, [b"c%d" % i, block, b""])  # an empty frame queued too
        server.send(back, [b"s%d" % i, block])
    from_client: list[bytes] = []
    from_server: list[bytes] = []
    deadline = time.monotonic() + 30
    while (len(from_client) < 40 or len(from_server) < 40) and time.monotonic() < deadline:
        env = server.recv(0.01)
        if env is not None:
            assert [f.nbytes for f in env.frames] == [len(b"c%d" % len(from_client)), 1 << 20, 0]
            from_client.append(bytes(env.frames[0]))
        env = client.recv(0.01)
        if env is not None:
            from_server.append(bytes(env.frames[0]))
    assert from_client == [b"c%d" % i for i in range(40)]
    assert from_server == [b"s%d" % i for i in range(40)]


@lane_only
def test_without_a_lane_on_the_other_side_messages_go_through_zeromq() -> None:
    server = ZmqTransport(bind=True, lane=False)
    client = ZmqTransport(bind=False, lane=True)
    try:
        peer = client.connect(server.address)
        assert not client.through_lane(peer)
        client.send(peer, [b"over tcp"])
        env = _recv(server)
        assert bytes(env.frames[0]) == b"over tcp" and not server.through_lane(env.peer)
    finally:
        client.close()
        server.close()


@lane_only
def test_the_lane_is_off_with_trimtab_shm_0_or_trimtab_lane_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert lane_from_env({})
    assert lane_from_env({"TRIMTAB_LANE": "1", "TRIMTAB_SHM": "1"})
    assert not lane_from_env({"TRIMTAB_LANE": "0"})
    assert not lane_from_env({"TRIMTAB_SHM": "0"})
    # The transport itself reads no environment variable: only what it is given.
    monkeypatch.setenv("TRIMTAB_LANE", "0")
    server = ZmqTransport(bind=True, lane=True)
    client = ZmqTransport(bind=False, lane=True)
    try:
        peer = client.connect(server.address)
        assert client.through_lane(peer)
    finally:
        client.close()
        server.close()


@lane_only
@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack("<I", 0),  # no frames
        struct.pack("<I", 1 << 30),  # absurd frame count
        struct.pack("<IQ", 1, 1 << 40),  # a frame over max_frame_bytes
    ],
    ids=["no-frames", "huge-count", "over-max-frame"],
)
def test_a_malformed_lane_message_closes_only_that_connection(garbage: bytes) -> None:
    server = ZmqTransport(bind=True, lane=True, max_frame_bytes=1 << 20)
    good = ZmqTransport(bind=False, lane=True)
    rogue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        rogue.connect(lane.lane_name(server.address))
        rogue.sendall(garbage + b"trailing bytes")
        peer = good.connect(server.address)
        good.send(peer, [b"still served"])
        env = _recv(server)
        assert bytes(env.frames[0]) == b"still served"
        rogue.settimeout(10.0)
        assert rogue.recv(16) == b""  # the server closed the rogue connection
        server.send(env.peer, [b"answer"])
        assert bytes(_recv(good).frames[0]) == b"answer"
    finally:
        rogue.close()
        good.close()
        server.close()


@lane_only
def test_a_departed_lane_peer_is_forgotten_and_a_broken_lane_reconnects() -> None:
    server = ZmqTransport(bind=True, lane=True)
    client = ZmqTransport(bind=False, lane=True)
    try:
        peer = client.connect(server.address)
        client.send(peer, [b"one"])
        back = _recv(server).peer
        client.close()
        assert server.recv(0.2) is None  # the hang-up is noticed, no message made of it
        server.send(back, [b"to nobody"])  # dropped, as ZeroMQ drops for a gone peer
        client = ZmqTransport(bind=False, lane=True)
        peer = client.connect(server.address)
        client.send(peer, [b"two"])
        assert bytes(_recv(server).frames[0]) == b"two"
    finally:
        client.close()
        server.close()


@lane_only
def test_closing_drops_at_once_what_waits_for_a_peer_whose_process_ended() -> None:
    """A peer's lane broke (its process ended) and a later send fell back to ZeroMQ,
    whose handshake nobody answers: closing does not wait out the linger for it (2 s,
    which every survivor of a killed server paid at its end), while a message to a live
    peer still leaves as the transport closes."""
    import secrets

    from trimtab.transport.auth import JobKey

    key = JobKey(secrets.token_bytes(32))
    live = ZmqTransport(bind=True, lane=True, auth=key)
    doomed = ZmqTransport(bind=True, lane=True, auth=key)
    client = ZmqTransport(bind=False, lane=True, auth=key)
    try:
        to_doomed = client.connect(doomed.address)
        client.send(to_doomed, [b"hello"])
        _recv(doomed, client)
        doomed.close()  # as a killed process's lane: broken
        deadline = time.monotonic() + 10
        while to_doomed not in client.lost():
            assert client.recv(0.05) is None and time.monotonic() < deadline
        to_live = client.connect(live.address)
        client.send(to_live, [b"first words"])
        _recv(live, client)
        client.send(to_doomed, [b"to nobody"])  # its lane is gone: through ZeroMQ
        client.send(to_live, [b"last words"])
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 1.0  # (the linger it no longer waits: 2 s)
        assert bytes(_recv(live).frames[0]) == b"last words"
    finally:
        client.close()
        live.close()


def test_closing_drops_at_once_what_waits_for_an_address_nobody_listens_on() -> None:
    """A server started as its job ended sends REGISTER to a coordinator that is gone:
    no connection ever comes up, and closing does not linger for it (it waited 4 s)."""
    import secrets

    from trimtab.transport.auth import JobKey

    key = JobKey(secrets.token_bytes(32))
    with socket.socket() as s:  # a free port, closed again: nobody listens there
        s.bind(("127.0.0.1", 0))
        nobody = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    node = ZmqTransport(bind=True, lane=True, auth=key)
    try:
        node.send(node.connect(nobody), [b"register"])
        assert node.recv(1.2) is None  # (a connection up within 1 s was not refused)
        started = time.monotonic()
        node.close()
        assert time.monotonic() - started < 1.0  # (the linger it no longer waits: 4 s)
    finally:
        node.close()


# -- polling before sleeping (TRIMTAB_SPIN_US) ------------------------------------------


def _cpu_of_a_quiet_wait(transport: ZmqTransport, timeout_s: float) -> float:
    started = time.process_time()
    assert transport.recv(timeout_s) is None
    return time.process_time() - started


@pytest.mark.parametrize(
    "use_lane", [pytest.param(True, marks=lane_only), False], ids=["lane", "zeromq"]
)
def test_a_polling_receive_reads_what_arrives_and_waits_out_its_timeout(use_lane: bool) -> None:
    server = ZmqTransport(bind=True, lane=use_lane)
    client = ZmqTransport(bind=False, lane=use_lane)
    try:
        peer = client.connect(server.address)
        assert client.through_lane(peer) == use_lane
        client.send(peer, [b"hello"])
        back = _recv(server).peer
        # Polls for 10 ms before each sleep: no message is lost, reordered or made up.
        server.spin_s = client.spin_s = 0.01

        def later() -> None:
            for i in range(20):
                time.sleep(0.001 * (i % 3))
                client.send(peer, [b"m%d" % i, b"x" * i])

        sender = threading.Thread(target=later)
        sender.start()
        got = [server.recv(10.0) for _ in range(20)]
        sender.join()
        assert [(bytes(e.frames[0]), bytes(e.frames[1])) for e in got if e is not None] == [
            (b"m%d" % i, b"x" * i) for i in range(20)
        ]
        server.send(back, [b"answer"])
        assert bytes(_recv(client).frames[0]) == b"answer"
        # Nothing to read: the wait polls for spin_s (a spin that caught nothing: its
        # record says so, whatever CPU a loaded machine lent it), then sleeps out the
        # rest of its timeout; without spin_s it sleeps all of it, spending no CPU.
        missed = server.spins.misses
        assert server.recv(0.05) is None
        assert server.spins.misses == missed + 1
        server.spin_s = 0.0
        assert _cpu_of_a_quiet_wait(server, 0.05) < 0.002
        assert server.recv(0) is None  # and recv(0) never polls for long
        # wake() from another thread ends a polling wait, as a sleeping one.
        server.spin_s = 0.005
        waker = threading.Timer(0.02, server.wake)
        waker.start()
        started = time.monotonic()
        assert server.recv(30.0) is None
        assert time.monotonic() - started < 10.0
        waker.join()
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("use_lane", [True, False], ids=["lane", "zeromq"])
def test_a_peer_whose_process_ends_is_lost_at_once_both_ways(use_lane: bool) -> None:
    # A peer in another process, killed outright: the node that serves it, and the one
    # that connected to that node, each learn its connection closed (Transport.lost()),
    # over the local lane as over ZeroMQ's TCP, with no silence to wait out.
    node = ZmqTransport(bind=True, lane=use_lane)
    script = textwrap.dedent(f"""
        import sys, time
        from trimtab.transport import ZmqTransport
        t = ZmqTransport(bind=True, lane={use_lane})
        peer = t.connect({node.address!r})
        t.send(peer, [b"hello from " + t.address.encode()])
        print(t.address, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        out = node.connect(address)  # this node connects to it too
        node.send(out, [b"hi"])
        env = node.recv(30)
        assert env is not None and bytes(env.frames[0]) == b"hello from " + address.encode()
        assert node.through_lane(env.peer) is use_lane
        proc.kill()
        proc.wait()
        lost: list[Peer] = []
        deadline = time.monotonic() + 20
        while {env.peer, out} - set(lost) and time.monotonic() < deadline:
            node.recv(0.2)
            lost += node.lost()
        assert {env.peer, out} <= set(lost)
    finally:
        proc.kill()
        node.close()


def _burst_of(server: ZmqTransport, want: int, *polled: ZmqTransport) -> list[Envelope]:
    """Bursts off ``server`` until ``want`` messages came (``polled`` transports are
    polled meanwhile: their handshakes move on their ``recv``); fails after 10 s."""
    got: list[Envelope] = []
    deadline = time.monotonic() + 10.0
    while len(got) < want and time.monotonic() < deadline:
        got += server.recv_burst(0.05, 256)
        for t in polled:
            assert t.recv(0) is None
    assert len(got) == want, f"{len(got)} of {want} messages"
    return got


@pytest.mark.parametrize("use_lane", [False, pytest.param(True, marks=lane_only)])
def test_a_burst_with_bad_messages_in_it_serves_the_rest_in_order(use_lane: bool) -> None:
    """Two members of a job (its key) send interleaved with an outsider (another key)
    and, on the lane, a connection that sends malformed framing: the outsider's
    messages are refused and counted, the malformed connection is closed (and lost),
    neither ends the receive, and every member's message comes, each member's in order."""
    from trimtab.transport.auth import JobKey

    key = JobKey(b"k" * 32)
    server = ZmqTransport(bind=True, lane=use_lane, auth=key, max_frame_bytes=1 << 20)
    members = [ZmqTransport(bind=False, lane=use_lane, auth=key) for _ in range(2)]
    outsider = ZmqTransport(bind=False, lane=use_lane, auth=JobKey(b"x" * 32))
    rogue = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        peers = [m.connect(server.address) for m in members]
        to_server = outsider.connect(server.address)
        if use_lane:
            rogue.connect(lane.lane_name(server.address))
        for i in range(20):
            for n, member in enumerate(members):
                member.send(peers[n], [b"%d" % n, b"%d" % i])
            outsider.send(to_server, [b"x", b"%d" % i])
            if use_lane and i == 10:
                rogue.sendall(struct.pack("<IQ", 1, 1 << 40) + b"over max_frame_bytes")
        got = _burst_of(server, 40, *members, outsider)
        for n in range(2):
            mine = [bytes(e.frames[1]) for e in got if bytes(e.frames[0]) == b"%d" % n]
            assert mine == [b"%d" % i for i in range(20)]
        assert server.recv_burst(0.3, 256) == []  # the outsider's never come
        assert outsider.recv(0) is None
        assert server.refused + outsider.refused >= 1
        if use_lane:
            rogue.settimeout(10.0)
            assert rogue.recv(16) == b""  # closed by the server: that connection only
            lost = server.lost()
            assert lost and not set(lost) & {e.peer for e in got}  # (and not the members')
            server.send(got[0].peer, [b"answer"])  # the members' lanes still serve
            assert bytes(_recv(members[int(bytes(got[0].frames[0]))]).frames[0]) == b"answer"
    finally:
        rogue.close()
        for t in (*members, outsider, server):
            t.close()
