"""The registry port's errors, named here for callers that import them from prebake.registry.errors
(they live in prebake.artifacts.ports.errors, the core's port)."""

from prebake.artifacts.ports import errors as _port
from prebake.artifacts.ports.errors import *  # noqa: F403

__all__ = [name for name in _port.__all__ if name != "is_fault"]
