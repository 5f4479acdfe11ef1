"""ORM calls from async code, and the connection hygiene that Django's request cycle would give them.

Django checks its connections only around a request (`close_old_connections` on
request_started / request_finished), in the thread that serves it. The async relay runs
ORM code in executor threads (`sync_to_async(thread_sensitive=False)`), and each of
those threads keeps a connection of its own for CONN_MAX_AGE. Nothing ever checked
them: after one PostgreSQL backend died, the thread holding it failed every call until
a restart. So `orm_call` does, around each call, what the request cycle does, and
before it a check that costs no round trip: an idle connection has nothing to read, so
a readable socket means the server hung up (or sent an unsolicited message, which is
just as good a reason to reconnect).

(Django's own ASGI handler runs each request's sync code in a thread of its own, so
requests never meet an old connection.) `socket_has_input` is also the pool's checkout check (buzz.runtime).
"""

from __future__ import annotations

import select
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

P = ParamSpec("P")
R = TypeVar("R")


def socket_has_input(fd: int) -> bool:
    """True when the socket has data or a hangup waiting (never blocks)."""
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def drop_dead_connections() -> None:
    """Close this thread's Django connections whose server side is gone; the next query reconnects."""
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            continue
        if conn.in_atomic_block:
            continue  # never pull a connection from under an open transaction
        if raw.closed or raw.broken or socket_has_input(raw.pgconn.socket):
            conn.close()


def _with_fresh_connections(fn: Callable[P, R]) -> Callable[P, R]:
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()  # errors and CONN_MAX_AGE, as a request's start does
        drop_dead_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            # As a request's end does: a connection that saw an error and is unusable is closed.
            close_old_connections()

    return run


def orm_call(fn: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`fn` (synchronous ORM code) as a coroutine function run in an executor thread, with checked connections.

    Not thread-sensitive: concurrent calls run concurrently (DESIGN.md, measured facts).
    """
    return sync_to_async(_with_fresh_connections(fn), thread_sensitive=False)
