"""The multi-host test bed as pytest fixtures: network namespaces as hosts.

``testbed_factory(hosts)`` makes a :class:`~trimtab.launch.testbed.Testbed` and removes it
when the test ends (and at exit, should the finalizer not run). A test that uses it is
skipped, with the reason, where this process may not make network namespaces (no root,
no ``CAP_NET_ADMIN``, no iproute2). Import the fixture into a test module to use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from trimtab.launch.testbed import Testbed, unavailable

__all__ = ["testbed_factory"]


@pytest.fixture
def testbed_factory() -> Iterator[Callable[[int], Testbed]]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"no multi-host test bed here: {why}")
    made: list[Testbed] = []

    def make(hosts: int) -> Testbed:
        bed = Testbed(hosts)
        made.append(bed)
        bed.up()
        return bed

    yield make
    for bed in made:
        bed.down()
