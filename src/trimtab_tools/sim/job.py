"""What a simulated job is: the settings ``trimtab run`` takes (the same
:class:`~trimtab.settings.JobSettings` and ``--straggler`` specs), the model's tensors,
the step count and the modelled machines."""

from __future__ import annotations

import dataclasses

from trimtab.core.chunks import ChunkSpec, TensorSpec, make_chunks
from trimtab.errors import ConfigError
from trimtab.faults.kills import FaultSpec
from trimtab.faults.stragglers import StragglerSpec
from trimtab.settings import JobSettings
from trimtab_tools.sim.cluster import ClusterModel

__all__ = ["SimJob", "model_tensors"]

MIB = 1 << 20


def model_tensors(model_mb: float, count: int) -> tuple[int, ...]:
    """``count`` float32 tensors of ``model_mb`` MiB in all, of four sizes in turn
    (1, 2, 3 and 4 parts), so that placements by hash and by bytes differ as in a real
    model's mix of layers. Raises :class:`ConfigError` for a size or count below 1."""
    if count < 1 or model_mb <= 0:
        raise ConfigError(f"need --tensors >= 1 and --model-mb > 0, got {count}, {model_mb}")
    weights = [1 + i % 4 for i in range(count)]
    total = model_mb * MIB
    return tuple(max(4, int(total * w / sum(weights)) // 4 * 4) for w in weights)


@dataclasses.dataclass(frozen=True)
class SimJob:
    """One simulated job. Construction raises :class:`ConfigError` for a setting the
    simulator does not model or out of range.

    Attributes:
        settings: workers, servers, placement, consistency, batching, elastic, as
            ``trimtab run``'s flags make them.
        cluster: the modelled machines.
        stragglers: the ``--straggler`` specs.
        tensor_bytes: the model's tensors, in declaration order (bytes, float32).
        steps: steps to run.
        batch: each worker's share of the global batch (``batch * workers`` samples).
        warmup: first steps left out of the figures.
        faults: the ``--fault`` specs: workers dying and joining (an elastic bsp job).
    """

    settings: JobSettings
    cluster: ClusterModel = dataclasses.field(default_factory=ClusterModel)
    stragglers: tuple[StragglerSpec, ...] = ()
    tensor_bytes: tuple[int, ...] = (MIB,) * 8
    steps: int = 200
    batch: int = 32
    warmup: int = 1
    faults: tuple[FaultSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.settings.elastic.replicas:
            raise ConfigError("the simulator models no replicas yet (--replicas)")
        if (self.faults or self.settings.elastic_workers) and not (
            self.settings.consistency.synchronous
        ):
            raise ConfigError(
                "the simulator models workers dying and joining (--fault, --min-workers, "
                "--max-workers) under --mode bsp only"
            )
        if self.steps < 1 or self.batch < 1 or not 0 <= self.warmup < self.steps:
            raise ConfigError(
                f"need --steps >= 1, --batch >= 1 and 0 <= --warmup < --steps, got "
                f"{self.steps}, {self.batch}, {self.warmup}"
            )
        if not self.tensor_bytes or min(self.tensor_bytes) < 4:
            raise ConfigError("the model needs at least one tensor of at least 4 bytes")

    @property
    def global_batch(self) -> int:
        """Samples per step, all workers together."""
        return self.batch * self.settings.workers

    def tensors(self) -> list[TensorSpec]:
        """The model's tensors as the workers declare them (float32)."""
        return [TensorSpec(f"t{i}", (b // 4,), "float32") for i, b in enumerate(self.tensor_bytes)]

    def chunks(self) -> list[ChunkSpec]:
        """The chunks of :meth:`tensors` at ``--chunk-bytes`` (the runtime's cut)."""
        return make_chunks(self.tensors(), self.settings.placement.chunk_bytes)
