"""Access changes: what must happen, in the same transaction, when who may read in a community changes.

The NIP-29 services (buzz.chat.channels, buzz.chat.bans), relay-member admission and removal
(buzz.identity.communities), token revocation (buzz.identity.tokens), the admin and an operator's policy
reset (moderation.services.reset_policy) call `access_changed` inside the transaction that makes the change.
It advances the community's policy stamp (buzz.models.PolicyStamp), which commits with the change, and so:

* NIP-AR incremental-read tokens minted before the change are refused after it commits, never before
  (artifacts.incremental binds the stamp);
* a live NIP-AR sync checks its reader again before the next head goes out (artifacts.sync);
* every channel's effective access epoch advances (buzz.access.policy.ChannelAccess.epoch: the channel's
  own epoch plus the stamp), so a live REQ decides its reader's access again before it delivers an event
  stored after the change, even when the change's own signal comes late or never (buzz.ws.req).

Membership grants and removals are not "access changes" here: each advances its own channel's access epoch
(buzz.chat.channels), and incremental reads replay them from their database-clock stamps
(Membership.joined_at, removed_at). What no such stamp can replay is: channel visibility, listing, TTL and
deletion; bans; relay admission; token revocation.
"""

from __future__ import annotations

from django.db import connection

_ADVANCE_STAMP = """
INSERT INTO buzz_policystamp (community_id, stamp, changed_at) VALUES (%s, 1, clock_timestamp())
ON CONFLICT (community_id) DO UPDATE SET stamp = buzz_policystamp.stamp + 1, changed_at = clock_timestamp()
"""


def access_changed(community_id: int) -> None:
    """Call inside the transaction (transaction.atomic) that changes who may read in the community: advances
    its policy stamp (Django's connection, the caller's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(_ADVANCE_STAMP, [community_id])
