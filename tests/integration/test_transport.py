"""The ZeroMQ transport over real loopback sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# One process binds, one connects; the receiver holds a round's 16 frames of 2 MiB, then
# drops them all (as a worker does once a step's values are copied into the parameters),
# and counts its minor page faults over the later rounds.
_RECEIVE = textwrap.dedent(
    """
    import json, resource, sys
    from trimtab._transport import ZmqTransport
    reuse = sys.argv[1] == "1"
    server = ZmqTransport(bind=True, reuse_buffers=reuse)
    client = ZmqTransport(bind=False, reuse_buffers=reuse)
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
