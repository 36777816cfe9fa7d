"""trimtab's phases in a user's own torch profile: ``trimtab.step``,
``trimtab.synchronize``, ``trimtab.push`` (a parameter's gradient sent) and
``trimtab.wait`` (its answers awaited and written back), as
``torch.profiler.record_function`` ranges.

A range costs a torch dispatch (about 2 us, 20 under load) even with no profiler on,
on the per-parameter path; :func:`marked` opens one only while a profiler records
(``torch.autograd.profiler._is_profiler_enabled``, a module flag torch's profilers set
and clear), and otherwise returns a shared do-nothing context: one attribute read.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

import torch.autograd.profiler as _profiler
from torch.profiler import record_function

_NOTHING = contextlib.nullcontext()
P = ParamSpec("P")
R = TypeVar("R")


def marked(name: str) -> AbstractContextManager[Any]:
    """A ``record_function(name)`` range while a torch profiler records, else a context
    that does nothing. Never blocks; raises nothing of its own."""
    if _profiler._is_profiler_enabled:
        return record_function(name)
    return _NOTHING


def marking(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A decorator: each call of the function inside :func:`marked` ``(name)``."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def marked_call(*args: P.args, **kwargs: P.kwargs) -> R:
            if _profiler._is_profiler_enabled:
                with record_function(name):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)

        return marked_call

    return decorate
