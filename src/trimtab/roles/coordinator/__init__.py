"""The coordinator role: membership, the placement map, step reports and the policy loop.
One per job; imports no torch."""

from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.node import Coordinator

__all__ = ["Coordinator", "CoordinatorConfig"]
