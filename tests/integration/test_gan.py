"""Several DistributedOptimizers in one job over real processes and TCP: a GAN-like
script (a generator and a discriminator, each with its own optimizer class, stepped
alternately) under ``trimtab run --workers 2 --servers 2`` gives the parameters of one
process running both optimizers over the same global batches, with chunks of both
models moving between servers at every step boundary or not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.gan_job import GanSetup, make_models, max_difference, reference
from tests.integration.test_equivalence import _run
from trimtab.core.chunks import TensorSpec, make_chunks
from trimtab.launch.job import LaunchConfig

SCRIPT = Path(__file__).with_name("gan_worker.py")

CASES = [
    # (generator's optimizer, discriminator's, per-worker batch sizes, migrate every N)
    ("adam", "sgd", (5, 19), 0),
    ("adam", "sgd", (9, 15), 1),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("gen", "disc", "sizes", "every"),
    # (the case without moves in the slow tier: the case with them runs the same path)
    [pytest.param(*c, marks=pytest.mark.slow if not c[3] else ()) for c in CASES],
    ids=[f"{g}-{d}{f'-moves{e}' if e else ''}" for g, d, _, e in CASES],
)
def test_two_optimizers_over_tcp_match_one_process(
    tmp_path: Path, gen: str, disc: str, sizes: tuple[int, ...], every: int
) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=256, rebalance_every=every)
    command = [sys.executable, str(SCRIPT), gen, disc, ",".join(map(str, sizes)), str(tmp_path)]
    _run(config, command, deadline_s=120.0)
    setup = GanSetup(gen, disc, sizes)
    expected = reference(setup)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    job, servers = stats["job"], stats["servers"]
    chunks = len(job["owners"])
    gen_model, disc_model = make_models(0)
    specs = [
        TensorSpec(n, tuple(p.shape), "float32")
        for model in (gen_model, disc_model)
        for n, p in model.named_parameters()
    ]
    assert chunks == len(make_chunks(specs, 256))  # both models' chunks, one table each
    # Both tables' chunks, each owned by exactly one server, each updated once per step
    # (the generator's from chunk 0, the discriminator's after it).
    versions = {int(c): v for s in servers for c, v in s["versions"].items()}
    assert sorted(versions) == list(range(chunks)) and set(versions.values()) == {setup.steps}
    assert sum(s["pushes"] for s in servers) == chunks * 2 * setup.steps
    if not every:
        assert job["epoch"] == 2  # the second table's map
    if every:
        assert job["migrations"] >= setup.steps // 2 // 2, job
        assert sum(s["moved_in"] for s in servers) >= chunks
    assert processes_of(config.job) == []
