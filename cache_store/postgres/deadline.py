"""A client-side deadline for calls to a PostgreSQL server that may be frozen or cut off.

The server enforces statement_timeout and lock_timeout itself, but a server that is stopped (SIGSTOP, a hung
machine) or behind a network partition never answers at all, and libpq then waits for as long as TCP does. A
timer shuts the connection's socket down once the deadline passes, so the blocked call fails at once and the
caller reports a miss / "not stored" that says the server did not answer.
"""
from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from typing import Any, Iterator

GRACE_S = 2.0  # beyond the server's own statement_timeout: a live server cancels first, with its own error


def timeout_settings(timeout_s: float | None) -> dict[str, str]:
    """The session settings that make the server itself give up (0: no limit)."""
    ms = "0" if timeout_s is None else str(max(1, int(timeout_s * 1000)))
    return {"statement_timeout": ms, "lock_timeout": ms}


def connect_timeout(timeout_s: float | None) -> str | None:
    """libpq's connect_timeout for this limit (whole seconds, at least 2: libpq's own minimum)."""
    return None if timeout_s is None else str(max(2, math.ceil(timeout_s)))


class Deadline:
    """Arms a timer around one call; `fired` tells the error handler that the deadline cut the connection."""

    def __init__(self) -> None:
        self.fired = False

    @contextlib.contextmanager
    def around(self, conn: Any, timeout_s: float | None) -> Iterator[None]:
        """Shut `conn`'s socket down if the body is still running after timeout_s + GRACE_S."""
        self.fired = False
        if timeout_s is None:
            yield
            return
        try:
            fd = conn.fileno()
        except Exception:  # a connection already broken has no socket to watch; the call fails by itself
            yield
            return
        timer = threading.Timer(timeout_s + GRACE_S, self._cut, (conn, fd))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _cut(self, conn: Any, fd: int) -> None:
        if getattr(conn, "closed", True):
            return
        self.fired = True
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()
