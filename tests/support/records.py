"""What the test database holds: checks against the rows the relay wrote (callable from async tests)."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from buzz.models import StoredEvent


@sync_to_async
def stored(event_id: str) -> bool:
    """Is there a StoredEvent row with this id?"""
    return StoredEvent.objects.filter(id=event_id).exists()


@sync_to_async
def stored_count() -> int:
    return StoredEvent.objects.count()
