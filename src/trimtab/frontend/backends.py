"""Horovod's questions about how it was built (``mpi_built()``, ``nccl_built()``, ...),
answered truthfully for trimtab: it uses none of MPI, Gloo, NCCL, DDL, oneCCL or ROCm's
collectives (its workers talk through a coordinator and parameter servers), so each of
those answers False; ``cuda_built()`` says whether this process's PyTorch has CUDA.

None of them blocks or needs ``init()``; only ``cuda_built`` and ``rocm_built`` import
torch.
"""

from __future__ import annotations

__all__ = [
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
]


def mpi_built() -> bool:
    """False: trimtab does not use MPI."""
    return False


def mpi_enabled() -> bool:
    """False: trimtab does not use MPI."""
    return False


def mpi_threads_supported() -> bool:
    """False: trimtab does not use MPI (its own calls are thread-safe where documented)."""
    return False


def gloo_built() -> bool:
    """False: trimtab does not use Gloo."""
    return False


def gloo_enabled() -> bool:
    """False: trimtab does not use Gloo."""
    return False


def nccl_built() -> bool:
    """False: trimtab does not use NCCL (tensors travel through host memory)."""
    return False


def ddl_built() -> bool:
    """False: trimtab does not use IBM's DDL."""
    return False


def ccl_built() -> bool:
    """False: trimtab does not use oneCCL."""
    return False


def cuda_built() -> bool:
    """Whether this process's PyTorch was built with CUDA (trimtab itself needs none:
    it copies CUDA tensors through host memory)."""
    import torch

    return getattr(torch.version, "cuda", None) is not None


def rocm_built() -> bool:
    """Whether this process's PyTorch was built for ROCm."""
    import torch

    return getattr(torch.version, "hip", None) is not None
