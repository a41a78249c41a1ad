"""A free TCP port on the loopback interface, for the processes an engine starts itself (vLLM's
server, the bundled engine's rank rendezvous).

The port is free when this returns and may be taken before the child binds it; each caller's child
reports a bind failure it can act on (vLLM's start fails and is logged, a rank's gloo rendezvous
fails the start), which is the contract every bind-to-port-0 pick has.
"""

from __future__ import annotations

import socket


def loopback_port() -> int:
    """A port the kernel just handed out on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
