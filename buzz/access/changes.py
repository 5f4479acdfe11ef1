"""Access-change hooks: what else must happen, in the same transaction, when what a reader can read changes.

The NIP-29 services (buzz.chat.channels, buzz.chat.bans), relay-member admission and removal
(buzz.identity.communities) and token revocation (buzz.identity.tokens) call `access_changed` inside
the transaction that makes the change. Apps register hooks from AppConfig.ready(): NIP-AR incremental
reads advance the community's policy stamp there (artifacts.incremental), so a checkpoint minted before
the change is refused after it commits, and never before. buzz imports no app: the registry is how
an app learns about the change.

Membership grants and removals are not "access changes" here: incremental reads replay them from
their database-clock stamps (Membership.joined_at, removed_at). What no stamp can replay is: channel
visibility, listing, TTL and deletion; bans; relay admission; token revocation.
"""

from __future__ import annotations

from collections.abc import Callable

AccessHook = Callable[[int], None]
_hooks: list[AccessHook] = []


def register_access_hook(hook: AccessHook) -> None:
    """`hook(community_id)` runs inside the transaction of every access change (synchronous ORM code)."""
    if hook not in _hooks:
        _hooks.append(hook)


def access_changed(community_id: int) -> None:
    """Call inside the transaction (transaction.atomic) that changes what a reader of the community can read."""
    for hook in _hooks:
        hook(community_id)
