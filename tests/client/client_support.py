"""A real relay for the client's tests: its community is the relay's own address, keys are admitted; and
the command line run as a subprocess (`cli`).

The client knows nothing of Host headers: it connects to ws://127.0.0.1:<port>/ and
signs NIP-42 and NIP-98 for that URL. So the community is created for host
127.0.0.1:<port> (its public URL is then the one the client uses) once the relay
process has its port, before any connection.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from artifacts.client import Keys
from buzz.chat import channels
from buzz.identity.communities import community_create, member_add
from buzz.models import Community
from tests.support.relay import RelayProcess

NO_QUOTA = {"BUZZ_WRITES_PER_SECOND": "0"}
BASE_DIR = Path(__file__).resolve().parents[2]


async def cli_process(*args: str) -> asyncio.subprocess.Process:
    """`python -m artifacts.client ARGS` from the checkout, as a user runs it, with its stdin, stdout and stderr
    piped (a command that keeps running, such as --follow, is read line by line)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "artifacts.client",
        *args,
        cwd=BASE_DIR,
        env=dict(os.environ),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def cli(*args: str, stdin: str | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
    """The command run to its end: (exit status, stdout, stderr)."""
    proc = await cli_process(*args)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


@dataclass
class ClientWorld:
    relay: RelayProcess
    community: Community
    keys: list[Keys]  # A, B, C: relay members
    key_files: list[Path]
    outsider: Keys  # not a relay member
    outsider_file: Path
    channel: str = ""  # private, A and B members
    address: str = ""  # host:port the client connects to (the community's host)

    @property
    def url(self) -> str:
        return f"ws://{self.address}/"

    @property
    def a(self) -> Keys:
        return self.keys[0]

    @property
    def b(self) -> Keys:
        return self.keys[1]


def write_key(path: Path, keys: Keys) -> Path:
    path.write_text(keys.secret_hex + "\n")
    path.chmod(0o600)
    return path


def admit(relay: RelayProcess, tmp: Path, *, members: int = 3, address: str | None = None) -> ClientWorld:
    """The relay's community, `members` admitted keys with key files, one private channel with A (its owner)
    and B. The community's host is the address the client connects to: the relay's own 127.0.0.1:<port>
    unless `address` names another (a proxy in front of it)."""
    where = address or f"{relay.host}:{relay.port}"
    community = community_create(host=where, name="Client tests")
    keys = [Keys.generate() for _ in range(members)]
    for k in keys:
        member_add(community=community, pubkey=k.pubkey)
    files = [write_key(tmp / f"key-{name}.hex", k) for name, k in zip("abcdefgh", keys, strict=False)]
    outsider = Keys.generate()
    world = ClientWorld(relay, community, keys, files, outsider, write_key(tmp / "key-outsider.hex", outsider))
    world.address = where
    world.channel = make_channel(world, keys[:2])
    return world


def make_channel(world: ClientWorld, members: list[Keys]) -> str:
    ch = uuid.uuid4()
    channels.channel_create(
        community=world.community, channel_uuid=ch, name="client", creator=members[0].pubkey, visibility="private"
    )
    for k in members[1:]:
        channels.member_put(community=world.community, channel_uuid=ch, actor=None, pubkey=k.pubkey)
    return str(ch)
