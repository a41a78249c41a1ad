"""Free loopback ports for the servers tests start.

A port is free when the kernel hands it to a bind on port 0; but once that socket closes, the
kernel may hand the same port out again before the server it was picked for has bound it. A
server that takes several ports (a Ray node takes six) or several servers started in a row could
then be given one port twice: Ray refuses that at start ("is trying to use a port number ... that
is used by other components"), and CI saw it. So ports are picked while the earlier picks are still
held, and a port this process has handed out is never handed out again.
"""

from __future__ import annotations

import contextlib
import socket
import threading

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing on `host` listens on now, none handed out before by this process."""
    with _lock, contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in _handed_out:
                ports.append(port)
                _handed_out.add(port)
        return ports


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port nothing listens on right now (also what a "registry down" test points at)."""
    return free_ports(1, host)[0]
