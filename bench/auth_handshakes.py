"""Benchmark: NIP-42 login handshakes per second on the relay.

Each of N clients, one handshake at a time: open a WebSocket, read
["AUTH", challenge], answer with a signed kind-22242 event, wait for
["OK", id, true, ""], close. Baselines measured in the same run:
- the same client loop against bench/echo_app.py (connect, greeting, one
  signed event echoed back, close): what uvicorn + websockets cost alone;
- pgbench simple-update tps with the same client count.

    python bench/auth_handshakes.py [--clients 8] [--seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import BenchError, LoopResult, Op, Server


def handshake_client(server: Server, signer: Any, relay_url: str, *, echo: bool) -> Any:
    @contextlib.asynccontextmanager
    async def setup() -> AsyncIterator[Op]:
        async def op() -> int:
            async with common.ws_connect(server) as ws:
                if echo:
                    first = json.loads(await ws.recv())
                    frame = common.auth_frame(signer, first[1], relay_url)
                    await ws.send(frame)
                    if await ws.recv() != frame:
                        raise BenchError("echo app returned something else")
                else:
                    await common.authenticate(ws, signer, relay_url)
            return 1  # one handshake (two server messages: challenge or greeting, then OK or echo)

        yield op

    return setup


async def measure(server: Server, signers: list[Any], seconds: float, *, echo: bool) -> LoopResult:
    relay_url = server.public_url or server.uri
    return await common.closed_loop(
        len(signers),
        seconds,
        lambda i: handshake_client(server, signers[i], relay_url, echo=echo)(),
        server=server,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pgbench-seconds", type=int, default=None, help="default: --seconds")
    parser.add_argument("--json", help="also write the figures to this file")
    common.add_app_option(parser)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the relay during its run (slows it down)")
    parser.add_argument("--profile-format", choices=("raw", "flamegraph", "speedscope"), default="raw")
    args = parser.parse_args(argv)
    if args.clients < 1 or not 0 < args.seconds <= 600:
        parser.error("--clients must be >= 1 and --seconds in (0, 600]")

    common.exit_on_sigterm()
    from buzz.nostr import Signer

    common.header(
        "auth_handshakes: NIP-42 handshakes/s (connect, AUTH challenge, signed 22242, OK true, close)",
        [
            f"{args.clients} closed-loop clients, {args.seconds:g} s measured after 1 s warm-up, one uvicorn worker",
            "baselines: same loop against a bare ASGI echo app; pgbench simple-update tps, same client count",
            *(
                [f"relay app: {args.app} from {args.app_dir or 'the repository'} (a variant)"]
                if args.app != common.RELAY_APP
                else []
            ),
        ],
    )
    signers = [Signer.generate() for _ in range(args.clients)]
    with contextlib.ExitStack() as stack:
        env = common.service_env(stack)
        relay = common.start_relay(stack, env, [s.pubkey for s in signers], app=args.app, app_dir=args.app_dir)
        echo = common.start_echo(stack)
        print(f"relay pid {relay.pid} on 127.0.0.1:{relay.port} (Host {relay.host_header}); echo pid {echo.pid}")

        profile = common.profile_path(args.profile, "auth_handshakes-relay", args.profile_format)
        with common.py_spy(relay.pid, profile, args.seconds + 1, args.profile_format):
            relay_res = common.run_async(measure(relay, signers, args.seconds, echo=False))
        print(f"relay handshakes : {relay_res.describe('handshakes')}", flush=True)
        common.report_profile(profile)
        echo_res = common.run_async(measure(echo, signers, args.seconds, echo=True))
        print(f"echo handshakes  : {echo_res.describe('handshakes')}", flush=True)
        common.stop_process(relay.proc)
        common.stop_process(echo.proc)
        pg = common.pgbench_tps(
            env["DATABASE_URL"], clients=args.clients, seconds=int(args.pgbench_seconds or round(args.seconds))
        )
        print(f"pgbench          : {common.describe_pgbench(pg)}")

    print("-" * 78)
    print(f"relay handshakes/s        {relay_res.rate:10.1f}")
    echo_ratio = common.ratio(relay_res.rate, echo_res.rate)
    print(f"echo handshakes/s         {echo_res.rate:10.1f}   relay / echo    = {echo_ratio}")
    print(f"pgbench simple-update tps {pg.tps:10.1f}   relay / pgbench = {common.ratio(relay_res.rate, pg.tps)}")
    if relay_res.errors or echo_res.errors:
        print("WARNING: errors during the run; the figures above are not clean")
    common.write_json(
        args.json,
        {
            "benchmark": "auth_handshakes",
            "nproc": common.nproc(),
            "clients": args.clients,
            "relay": relay_res.summary(),
            "echo": echo_res.summary(),
            "pgbench": pg.__dict__,
        },
    )
    return 1 if relay_res.errors else 0


if __name__ == "__main__":
    common.run_main(main)
