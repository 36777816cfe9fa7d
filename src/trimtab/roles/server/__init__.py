"""The server role: owns chunks (value, optimizer state, version), merges pushed gradients,
applies the optimizer and sends values back."""

from trimtab.roles.server.config import ServerConfig
from trimtab.roles.server.node import Server

__all__ = ["Server", "ServerConfig"]
