"""A free TCP port on loopback, for tests that serve something (a console, a channel)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's choice; free until someone binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
