"""A registry of named policy implementations (one per kind of policy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from trimtab.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories of one kind of policy.

    Unknown names and duplicate registrations are refused with a :class:`ConfigError`
    that lists what is available. Not thread-safe for registration (do it at import).
    """

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator registering a factory (usually a class) under ``name``."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise ConfigError(f"{self._kind} policy {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return add

    def create(self, name: str, **kwargs: object) -> T:
        """Build the policy named ``name``. Raises :class:`ConfigError` if unknown."""
        try:
            factory = self._factories[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self._kind} policy {name!r}; choose one of {self.names()}"
            ) from None
        return factory(**kwargs)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._factories)
