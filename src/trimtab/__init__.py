"""trimtab: a parameter server for data-parallel PyTorch training that stays fast when
machines are slow.

Use it like Horovod::

    import trimtab
    trimtab.init()
    optimizer = trimtab.DistributedOptimizer(optimizer, model.named_parameters())
    trimtab.broadcast_parameters(model.state_dict(), root_rank=0)

and start the job with ``trimtab run --workers 2 --servers 2 -- python train.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # the names below load lazily (PEP 562): see __getattr__
    from trimtab.frontend.api import (
        barrier,
        broadcast_optimizer_state,
        broadcast_parameters,
        config_from_env,
        cross_rank,
        cross_size,
        init,
        is_initialized,
        job_status,
        local_rank,
        local_size,
        rank,
        server_stats,
        shutdown,
        size,
        start_step,
    )
    from trimtab.frontend.backends import (
        ccl_built,
        cuda_built,
        ddl_built,
        gloo_built,
        gloo_enabled,
        mpi_built,
        mpi_enabled,
        mpi_threads_supported,
        nccl_built,
        rocm_built,
    )
    from trimtab.frontend.byteps import (
        declare,
        push_pull,
        push_pull_async,
        push_pull_async_inplace,
        push_pull_inplace,
    )
    from trimtab.frontend.collectives import (
        Handle,
        allgather,
        allgather_async,
        allgather_object,
        allreduce,
        allreduce_,
        allreduce_async,
        allreduce_async_,
        broadcast,
        broadcast_,
        broadcast_async,
        broadcast_async_,
        broadcast_object,
        join,
        poll,
        synchronize,
    )
    from trimtab.frontend.compression import Compression
    from trimtab.frontend.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
    from trimtab.frontend.optimizer import DistributedOptimizer
    from trimtab.roles.coordinator import Coordinator, CoordinatorConfig
    from trimtab.roles.server import Server, ServerConfig
    from trimtab.roles.worker.config import WorkerConfig
    from trimtab.roles.worker.context import Context


__version__ = "0.1.0"

__all__ = [
    "Adasum",
    "Average",
    "ChunkMoved",
    "Compression",
    "ConfigError",
    "Context",
    "Coordinator",
    "CoordinatorConfig",
    "DistributedOptimizer",
    "FatalError",
    "Handle",
    "JobAborted",
    "Max",
    "Min",
    "NodeTimeout",
    "Product",
    "ProtocolError",
    "ReduceOp",
    "RemoteError",
    "RetryableError",
    "Server",
    "ServerConfig",
    "Sum",
    "TrimtabError",
    "UsageError",
    "WorkerConfig",
    "__version__",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "config_from_env",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "declare",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "job_status",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_async_inplace",
    "push_pull_inplace",
    "rank",
    "rocm_built",
    "server_stats",
    "shutdown",
    "size",
    "start_step",
    "synchronize",
]

#: Where each public name lives. Importing ``trimtab`` loads none of them: a name's
#: module is imported on first use, so the launcher, the coordinator and ``trimtab
#: --help`` never load torch, which only the front end and the servers need.
_LAZY = {
    **dict.fromkeys(
        (
            "barrier",
            "broadcast_optimizer_state",
            "broadcast_parameters",
            "config_from_env",
            "cross_rank",
            "cross_size",
            "init",
            "is_initialized",
            "job_status",
            "local_rank",
            "local_size",
            "rank",
            "server_stats",
            "shutdown",
            "size",
            "start_step",
        ),
        "trimtab.frontend.api",
    ),
    **dict.fromkeys(
        (
            "Handle",
            "allgather",
            "allgather_async",
            "allgather_object",
            "allreduce",
            "allreduce_",
            "allreduce_async",
            "allreduce_async_",
            "broadcast",
            "broadcast_",
            "broadcast_async",
            "broadcast_async_",
            "broadcast_object",
            "join",
            "poll",
            "synchronize",
        ),
        "trimtab.frontend.collectives",
    ),
    **dict.fromkeys(
        (
            "ccl_built",
            "cuda_built",
            "ddl_built",
            "gloo_built",
            "gloo_enabled",
            "mpi_built",
            "mpi_enabled",
            "mpi_threads_supported",
            "nccl_built",
            "rocm_built",
        ),
        "trimtab.frontend.backends",
    ),
    **dict.fromkeys(
        (
            "declare",
            "push_pull",
            "push_pull_async",
            "push_pull_async_inplace",
            "push_pull_inplace",
        ),
        "trimtab.frontend.byteps",
    ),
    **dict.fromkeys(
        (
            "Adasum",
            "Average",
            "Max",
            "Min",
            "Product",
            "ReduceOp",
            "Sum",
        ),
        "trimtab.frontend.ops",
    ),
    "Compression": "trimtab.frontend.compression",
    "DistributedOptimizer": "trimtab.frontend.optimizer",
    "Coordinator": "trimtab.roles.coordinator",
    "CoordinatorConfig": "trimtab.roles.coordinator",
    "Server": "trimtab.roles.server",
    "ServerConfig": "trimtab.roles.server",
    "WorkerConfig": "trimtab.roles.worker.config",
    "Context": "trimtab.roles.worker.context",
}


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562). Raises AttributeError for
    a name ``trimtab`` does not have."""
    if name == "nn":  # the subpackage of modules (trimtab.nn.Embedding)
        return importlib.import_module("trimtab.nn")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trimtab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later uses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
