"""Host identity: shared memory is for one host, a network namespace of one machine."""

from __future__ import annotations

import re

import pytest

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.server.slots import SharedArenas
from trimtab.transport.hostid import host_id, is_own_address
from trimtab.transport.shm import SHM_DIR, Arena, is_local, job_prefix


def test_host_id_is_stable_and_short() -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", host_id())
    assert host_id() == host_id()


@pytest.mark.parametrize(
    ("address", "own"),
    [("127.0.0.1", True), ("::1", True), ("10.255.255.254", False), ("example.org", False)],
)
def test_own_addresses_are_those_this_stack_can_bind(address: str, own: bool) -> None:
    assert is_own_address(address) is own
    assert is_local(f"tcp://{address}:5555") is own


def _push(name: str) -> dict:
    return {"r": 0, "sm": [name, 0, 64], "n": 4, "dt": "float32"}


def test_a_server_maps_only_arenas_of_its_own_host() -> None:
    job = "hosttest"
    arena = Arena.create(job, "w0", 128)
    try:
        assert f"-{host_id()}-" in arena.name  # the worker's host, in the arena's name
        arenas = SharedArenas(job)
        slot, [data] = arenas.read(_push(arena.name), [], server=0)
        assert data.nbytes == 16 and slot.arena.name == arena.name
        # The same arena, named as one from another host (/dev/shm is shared by the
        # network namespaces of a machine): refused before it is mapped, as no_shm.
        elsewhere = arena.name.replace(host_id(), "0" * 12)
        (SHM_DIR / elsewhere).hardlink_to(SHM_DIR / arena.name)
        try:
            with pytest.raises(ProtocolError) as refused:
                arenas.read(_push(elsewhere), [], server=3)
            assert refused.value.args[0] == ErrorCode.NO_SHM.value
            assert "not on worker 0's host" in str(refused.value)
        finally:
            (SHM_DIR / elsewhere).unlink()
        arenas.close()
    finally:
        arena.close()
    assert list(SHM_DIR.glob(job_prefix(job) + "*")) == []
