"""A/B variant for the benchmarks: the relay with one Channels behaviour switched off.

Channels' AsyncConsumer.dispatch awaits `aclose_old_connections()` before every
handler, i.e. `sync_to_async(close_old_connections)()`: a hop to asgiref's
single thread-sensitive executor thread and back for each WebSocket event
(connect, every received frame, disconnect). The relay's WebSocket path uses
the async psycopg pool, not the ORM, so this variant replaces that call with a
no-op to measure what the hop costs:

    python bench/frames.py --app skip_close_old_connections:application --app-dir bench/variants

Only for measuring; nothing in the relay imports this module.
"""

from __future__ import annotations

import channels.consumer


async def _skip_close_old_connections() -> None:
    return None


channels.consumer.aclose_old_connections = _skip_close_old_connections  # type: ignore[attr-defined]

from buzz.asgi import application  # noqa: E402

__all__ = ["application"]
