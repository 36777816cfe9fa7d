"""trimtab: a parameter server for data-parallel PyTorch training that stays fast when
machines are slow.

Use it like Horovod::

    import trimtab
    trimtab.init()
    optimizer = trimtab.DistributedOptimizer(optimizer, model.named_parameters())
    trimtab.broadcast_parameters(model.state_dict(), root_rank=0)

and start the job with ``trimtab run --workers 2 --servers 2 -- python train.py``.
"""

from trimtab.errors import (
    ChunkMoved,
    ConfigError,
    FatalError,
    JobAborted,
    NodeTimeout,
    ProtocolError,
    RemoteError,
    RetryableError,
    TrimtabError,
    UsageError,
)
from trimtab.frontend.api import (
    barrier,
    broadcast_optimizer_state,
    broadcast_parameters,
    config_from_env,
    init,
    is_initialized,
    job_status,
    local_rank,
    local_size,
    rank,
    server_stats,
    shutdown,
    size,
)
from trimtab.frontend.compression import Compression
from trimtab.frontend.optimizer import DistributedOptimizer
from trimtab.roles.coordinator import Coordinator, CoordinatorConfig
from trimtab.roles.server import Server, ServerConfig
from trimtab.roles.worker.client import WorkerConfig
from trimtab.roles.worker.context import Context

__version__ = "0.1.0"

__all__ = [
    "ChunkMoved",
    "Compression",
    "ConfigError",
    "Context",
    "Coordinator",
    "CoordinatorConfig",
    "DistributedOptimizer",
    "FatalError",
    "JobAborted",
    "NodeTimeout",
    "ProtocolError",
    "RemoteError",
    "RetryableError",
    "Server",
    "ServerConfig",
    "TrimtabError",
    "UsageError",
    "WorkerConfig",
    "__version__",
    "barrier",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "config_from_env",
    "init",
    "is_initialized",
    "job_status",
    "local_rank",
    "local_size",
    "rank",
    "server_stats",
    "shutdown",
    "size",
]
