"""examples/quickstart.py, run verbatim against a real relay process.

The script admits its generated key with manage.py (given the relay's DATABASE_URL, as a
shell with the URLs set would), then talks to the relay only as a client: NIP-42 AUTH,
kind 9007 and 9, a kind-45010 create and update, and POST /query signed with NIP-98.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from asgiref.sync import sync_to_async

from artifacts.models import Artifact
from buzz.identity.communities import community_create
from buzz.models import RelayMember, StoredEvent
from tests.support.relay import RelayFactory

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def _run(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), url], env=env, capture_output=True, text=True, timeout=180, check=False
    )


async def test_quickstart_script_against_a_relay(relay_factory: RelayFactory) -> None:
    relay = relay_factory()
    host = f"localhost:{relay.port}"
    community = await sync_to_async(community_create)(host=host, name="Quickstart", public_url=f"ws://{host}/")

    result = await sync_to_async(_run)(f"ws://{host}/", relay.environment())
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    out = result.stdout
    assert "Traceback" not in result.stderr

    pubkey = re.search(r"^key +pubkey ([0-9a-f]{64}) ", out, re.M)
    channel = re.search(r"^channel +created open channel ([0-9a-f-]{36}) \(kind 9007\)$", out, re.M)
    message = re.search(r"^message +posted ([0-9a-f]{64}) \(kind 9\)$", out, re.M)
    created = re.search(
        r"^artifact +created ([0-9a-f-]{36}): revision ([0-9a-f]{64}) \(kind 45010, op=create\)$", out, re.M
    )
    updated = re.search(
        r"^artifact +updated ([0-9a-f-]{36}): revision ([0-9a-f]{64}) \(op=update, prev=(\w+)\)$", out, re.M
    )
    current = re.search(r"^current +d=([0-9a-f-]{36}) title='([^']*)' revision ([0-9a-f]{64})$", out, re.M)
    assert pubkey and channel and message and created and updated and current, out
    assert re.search(r"^query +POST /query current #h=\S+: 1 artifact\(s\)$", out, re.M), out
    assert re.search(r"^done ", out, re.M), out

    # What it printed is what the relay holds.
    assert updated.group(3) == created.group(2)
    assert current.group(1) == created.group(1) == updated.group(1)
    assert current.group(3) == updated.group(2)
    assert current.group(2) == "Quickstart note, edited"

    def stored() -> tuple[str | None, bool, bool]:
        artifact = Artifact.objects.get(community=community, d=uuid.UUID(created.group(1)))
        return (
            artifact.head_id,
            StoredEvent.objects.filter(id=message.group(1), kind=9, channel_id=uuid.UUID(channel.group(1))).exists(),
            RelayMember.objects.filter(community=community, pubkey=pubkey.group(1)).exists(),
        )

    head, message_stored, admitted = await sync_to_async(stored)()
    assert head == updated.group(2)
    assert message_stored and admitted
