"""The simulator drives the runtime's own policy objects, never copies of them: its
modules define nothing a policy module defines, build the policies from the registries,
and a policy swapped in a registry changes what the simulation decides."""

from __future__ import annotations

import ast
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

import trimtab.policies
import trimtab_tools.sim
from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.faults.stragglers import parse_stragglers
from trimtab.policies.batching import (
    BATCHING,
    BatchSizingPolicy,
    NarxPredictor,
    WorkerSample,
    equal_split,
)
from trimtab.policies.consistency import ConsistencyPolicy
from trimtab.policies.detection import StragglerDetector
from trimtab.policies.placement import PLACEMENTS, PlacementPolicy
from trimtab.policies.psld import PsldController, SpeedEstimator
from trimtab.policies.scaling import ScalingPolicy
from trimtab.settings import BatchingSettings, JobSettings, PlacementSettings
from trimtab_tools.sim.decisions import Policies
from trimtab_tools.sim.engine import Simulation
from trimtab_tools.sim.job import SimJob

POLICY_BASES = (
    PlacementPolicy,
    ConsistencyPolicy,
    BatchSizingPolicy,
    StragglerDetector,
    ScalingPolicy,
    PsldController,
    SpeedEstimator,
)


def _defined(package: object) -> dict[str, set[str]]:
    """Per module file of ``package``: the names of its top-level functions and classes
    and of their methods (dunders left out)."""
    root = Path(package.__file__).parent  # type: ignore[attr-defined]
    out: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        names: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {
                    m.name
                    for m in node.body
                    if isinstance(m, ast.FunctionDef) and not m.name.startswith("__")
                }
        out[str(path)] = names
    return out


def test_no_simulator_module_defines_what_a_policy_module_defines() -> None:
    policy_names = set().union(*_defined(trimtab.policies).values())
    for path, names in _defined(trimtab_tools.sim).items():
        copied = names & policy_names
        assert not copied, f"{path} defines {sorted(copied)}: drive trimtab.policies' instead"


def test_no_simulator_class_is_a_policy() -> None:
    import importlib
    import inspect
    import pkgutil

    for info in pkgutil.iter_modules(trimtab_tools.sim.__path__):
        module = importlib.import_module(f"trimtab_tools.sim.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                assert not issubclass(cls, POLICY_BASES), f"{cls} is a policy of its own"


def test_the_policies_are_the_registries_objects() -> None:
    job = JobSettings(4, 2, placement=PlacementSettings("psld"), batching=BatchingSettings("lbbsp"))
    p = Policies(job)
    assert type(p.placement) is type(PLACEMENTS.create("psld"))
    assert type(p.batching) is type(BATCHING.create("lbbsp"))
    assert isinstance(p.psld, PsldController) and isinstance(p.speeds, SpeedEstimator)
    assert p.psld.min_servers == 2
    assert Policies(JobSettings(4, 2)).psld is None  # greedy is not live


class _AllOnOne(PlacementPolicy):
    name = "test-all-on-one"

    def place(
        self, tensors: Sequence[TensorSpec], chunks: Sequence[ChunkSpec], num_servers: int
    ) -> list[int]:
        return [num_servers - 1] * len(chunks)


def _job(placement: str = "hash", batching: str = "equal", stragglers: str = "") -> SimJob:
    settings = JobSettings(
        4,
        2,
        placement=PlacementSettings(placement, 256 << 10),
        batching=BatchingSettings(batching),
    )
    return SimJob(settings, stragglers=tuple(parse_stragglers(stragglers)), steps=20)


def test_a_placement_swapped_in_the_registry_changes_the_simulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = Simulation(_job())
    before.run()
    monkeypatch.setitem(PLACEMENTS._factories, "hash", _AllOnOne)
    after = Simulation(_job())
    after.run()
    assert set(after.owners.tolist()) == {1} != set(before.owners.tolist())
    assert after.trace.ends[-1] > 1.1 * before.trace.ends[-1]  # one server does it all


class _Recording(BatchSizingPolicy):
    """Gives worker 0 everything it can; records what it was asked."""

    name = "test-recording"
    seen: list[int] = []

    def batch_sizes(
        self, history: Mapping[int, Sequence[WorkerSample]], global_batch: int
    ) -> dict[int, int]:
        self.seen.append(sum(len(h) for h in history.values()))
        if not any(history.values()):
            return dict(enumerate(equal_split(global_batch, len(history))))
        return {r: global_batch - len(history) + 1 if r == 0 else 1 for r in history}


def test_a_batching_swapped_in_the_registry_decides_the_simulated_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(BATCHING._factories, "lbbsp", _Recording)
    _Recording.seen = []
    sim = Simulation(_job(batching="lbbsp"))
    sim.run()
    assert sim.trace.batch_max[-1] == 4 * 32 - 3 and sim.trace.batch_min[-1] == 1
    assert _Recording.seen[:3] == [0, 4, 8]  # every worker's sample of each step, in turn


def test_narx_predicts_many_as_it_predicts_one() -> None:
    rng = random.Random(3)
    histories = [
        [
            WorkerSample(r, 32, rng.uniform(0.01, 0.05), 0.01, rng.uniform(0.3, 1.0))
            for _ in range(rng.choice([1, 5, 7, 12, 20, 30]))
        ]
        for r in range(40)
    ]
    narx = NarxPredictor()
    assert narx.predict_many(histories) == pytest.approx([narx.predict(h) for h in histories])
    flat = NarxPredictor(ridge=0.0)  # fitted one by one
    assert flat.predict_many(histories) == [flat.predict(h) for h in histories]


def test_the_simulator_loads_no_role_transport_torch_or_zmq() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, trimtab_tools.sim as s\n"
        "for m in pkgutil.iter_modules(s.__path__):\n"
        "    importlib.import_module(s.__name__ + '.' + m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'zmq') or "
        "m.startswith(('trimtab.roles', 'trimtab.transport'))]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
