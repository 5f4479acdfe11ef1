"""Benchmark: client frames per second through the relay's consumer, by kind of frame.

8 authenticated clients, one frame in flight each (closed loop), one mix at a time:
  req      ["REQ", sub, {"kinds":[9], "limit":10}] -> EVENT* then EOSE, then ["CLOSE", sub]
           (CLOSE has no reply; it is sent before the next REQ)
  req-h    the same with "#h": [a channel of its own] (each client creates an open channel first, kind 9007):
           a REQ that names its channel, as a chat client's does
  badsig   ["EVENT", <kind-9 event with a broken signature>] -> ["OK", id, false, "invalid: ..."]
  garbage  text that is not JSON -> ["NOTICE", "invalid: ..."]
frames/s counts server messages received per second. Baselines in the same run:
- the same loop against bench/echo_app.py, the three frames in rotation (frames/s echoed);
- pgbench simple-update tps with the same client count.

    python bench/frames.py [--clients 8] [--seconds 8] [--mix req,req-h,badsig,garbage] [--seed 0] [--json out.json]

--seed N stores N kind-9 events in the bench community first, so a REQ returns
min(N, 10) EVENT frames before its EOSE (default 0: every REQ gets EOSE only).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import ingest
from common import BenchError, LoopResult, Op, Server

MIXES = ("req", "req-h", "badsig", "garbage")
GARBAGE = '["REQ", {not json'

_SEED = """
from django.db import transaction
from buzz.identity.communities import community_by_host
from buzz.events.store import store_sync
from buzz.nostr import Signer

community = community_by_host({host!r})
signer = Signer.generate()
with transaction.atomic():
    for i in range({count}):
        event = signer.sign_event(kind=9, tags=[], content=f"bench message {{i}}")
        store_sync(community_id=community.pk, event=event, channel=None)
"""


def bad_signature_frames(signer: Any, count: int) -> list[str]:
    """Kind-9 events whose id is right and whose signature is not (one hex digit changed)."""
    frames = []
    for i in range(count):
        event = signer.sign_event(kind=9, tags=[["t", "bench"]], content=f"frame benchmark {i}").to_dict()
        sig = event["sig"]
        event["sig"] = ("1" if sig[0] != "1" else "2") + sig[1:]
        frames.append(json.dumps(["EVENT", event], separators=(",", ":")))
    return frames


def relay_client(server: Server, signer: Any, mix: str, index: int) -> Callable[[], Any]:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(server) as ws:
            await common.authenticate(ws, signer, server.public_url)
            sub = f"bench-{index}"
            flt: dict[str, Any] = {"kinds": [9], "limit": 10}
            if mix == "req-h":
                channel = str(uuid.uuid4())
                await ingest.send_and_confirm(ws, signer, 9007, [["h", channel], ["name", f"frames {index}"]])
                flt["#h"] = [channel]
            req = json.dumps(["REQ", sub, flt])
            close = json.dumps(["CLOSE", sub])
            events = itertools.cycle(bad_signature_frames(signer, 32))

            async def op_req() -> int:
                await ws.send(req)
                n = 0
                while True:
                    msg = json.loads(await ws.recv())
                    n += 1
                    if msg[0] == "EOSE" and msg[1] == sub:
                        break
                    if msg[0] != "EVENT":
                        raise BenchError(f"REQ got {msg!r}")
                await ws.send(close)
                return n

            async def op_badsig() -> int:
                await ws.send(next(events))
                msg = json.loads(await ws.recv())
                if msg[0] != "OK" or msg[2] is not False or not str(msg[3]).startswith("invalid:"):
                    raise BenchError(f"bad-signature EVENT got {msg!r}")
                return 1

            async def op_garbage() -> int:
                await ws.send(GARBAGE)
                msg = json.loads(await ws.recv())
                if msg[0] != "NOTICE":
                    raise BenchError(f"garbage got {msg!r}")
                return 1

            yield {"req": op_req, "req-h": op_req, "badsig": op_badsig, "garbage": op_garbage}[mix]

    return setup


def open_relay_client(server: Server, signers: list[Any], mix: str, index: int) -> Any:
    return relay_client(server, signers[index], mix, index)()


def echo_client(server: Server, signer: Any) -> Callable[[], Any]:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async with common.ws_connect(server) as ws:
            await ws.recv()  # the greeting, like the relay's challenge
            req = json.dumps(["REQ", "bench-echo", {"kinds": [9], "limit": 10}])
            frames = itertools.cycle([req, *bad_signature_frames(signer, 1), GARBAGE])

            async def op() -> int:
                frame = next(frames)
                await ws.send(frame)
                if await ws.recv() != frame:
                    raise BenchError("echo app returned something else")
                return 1

            yield op

    return setup


def seed_events(env: dict[str, str], relay: Server, count: int) -> None:
    code = _SEED.format(host=relay.host_header, count=count)
    common.checked(common.manage(env, "shell", "-c", code), "seeding kind-9 events")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per mix")
    parser.add_argument("--mix", default=",".join(MIXES), help=f"comma-separated subset of {','.join(MIXES)}")
    parser.add_argument("--seed", type=int, default=0, help="kind-9 events to store first")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this file")
    common.add_app_option(parser)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relay during each mix (slows it down)")
    parser.add_argument("--profile-format", choices=("raw", "flamegraph", "speedscope"), default="raw")
    args = parser.parse_args(argv)
    mixes = [m.strip() for m in args.mix.split(",") if m.strip()]
    if not mixes or any(m not in MIXES for m in mixes):
        parser.error(f"--mix takes names from {', '.join(MIXES)}")
    if args.clients < 1 or not 0 < args.seconds <= 600 or not 0 <= args.seed <= 100_000:
        parser.error("--clients >= 1, --seconds in (0, 600], --seed in [0, 100000]")

    common.exit_on_sigterm()
    from buzz.nostr import Signer

    common.header(
        "frames: relay responses/s per frame mix, authenticated clients, one frame in flight each",
        [
            f"{args.clients} clients, {args.seconds:g} s per mix after 1 s warm-up, mixes: {', '.join(mixes)}; "
            f"{args.seed} kind-9 events stored",
            "baselines: the same frame loop against a bare ASGI echo app; pgbench simple-update tps",
            *(
                [f"relay app: {args.app} from {args.app_dir or 'the repository'} (a variant)"]
                if args.app != common.RELAY_APP
                else []
            ),
        ],
    )
    signers = [Signer.generate() for _ in range(args.clients)]
    results: dict[str, LoopResult] = {}
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        relay = common.start_relay(stack, env, [s.pubkey for s in signers], app=args.app, app_dir=args.app_dir)
        if args.seed:
            seed_events(env, relay, args.seed)
        echo = common.start_echo(stack)
        print(f"relay pid {relay.pid} on 127.0.0.1:{relay.port} (Host {relay.host_header}); echo pid {echo.pid}")
        for mix in mixes:
            profile = common.profile_path(args.profile, f"frames-{mix}", args.profile_format)
            with common.py_spy(relay.pid, profile, args.seconds + 1, args.profile_format):
                res = common.run_async(
                    common.closed_loop(
                        args.clients,
                        args.seconds,
                        functools.partial(open_relay_client, relay, signers, mix),
                        server=relay,
                    )
                )
            results[mix] = res
            print(f"relay {mix:<8}: {res.describe('round trips' if mix.startswith('req') else 'frames')}", flush=True)
            common.report_profile(profile)
        echo_res = common.run_async(
            common.closed_loop(args.clients, args.seconds, lambda i: echo_client(echo, signers[i])(), server=echo)
        )
        print(f"echo          : {echo_res.describe('frames')}", flush=True)
        common.stop_process(relay.proc)
        common.stop_process(echo.proc)
        pg = common.pgbench_tps(env["DATABASE_URL"], clients=args.clients, seconds=args.pgbench_seconds)
        print(f"pgbench       : {common.describe_pgbench(pg)}")

    print("-" * 78)
    print(f"{'':<16}{'frames/s':>10}{'round trips/s':>15}{'/ echo':>9}{'/ pgbench':>11}")
    for mix, res in results.items():
        print(
            f"relay {mix:<10}{res.response_rate:10.1f}{res.rate:15.1f}"
            f"{common.ratio(res.response_rate, echo_res.response_rate):>9}{common.ratio(res.response_rate, pg.tps):>11}"
        )
    print(f"{'echo':<16}{echo_res.response_rate:10.1f}{echo_res.rate:15.1f}")
    print(f"{'pgbench tps':<16}{pg.tps:10.1f}")
    errors = sum(r.errors for r in results.values()) + echo_res.errors
    if errors:
        print("WARNING: errors during the run; the figures above are not clean")
    common.write_json(
        args.json,
        {
            "benchmark": "frames",
            "nproc": common.nproc(),
            "clients": args.clients,
            "seed": args.seed,
            "relay": {mix: r.summary() for mix, r in results.items()},
            "echo": echo_res.summary(),
            "pgbench": pg.__dict__,
        },
    )
    return 1 if errors else 0


if __name__ == "__main__":
    common.run_main(main)
