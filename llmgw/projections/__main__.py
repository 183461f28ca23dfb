"""The projector: follow the log and keep the SQLite read models at PATH.

    python -m llmgw.projections --nats URL --db PATH [--rebuild]

It follows the log until SIGINT or SIGTERM and keeps the read models at
PATH; after any crash, run it again and it resumes where its last commit
stands. `--rebuild` builds PATH afresh from the whole log and exits (stop
the running projector of PATH first).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from ..bus.nats import NatsBus
from .projector import MAX_BATCH, Projector, ProjectorFailed, rebuild


async def _main(args: argparse.Namespace) -> None:
    bus = await NatsBus.connect(args.nats, name="llmgw-projector", forever=not args.rebuild)
    try:
        await bus.wait_for_streams(timeout=args.wait_streams)
        if args.rebuild:
            seq = await rebuild(bus, args.db)
            print(f"rebuilt {args.db} up to seq {seq}")
            return
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await Projector(bus, args.db, max_batch=args.max_batch).run(stop)
    finally:
        await bus.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m llmgw.projections", description=__doc__.split("\n\n")[0])
    p.add_argument("--nats", default=os.environ.get("LLMGW_NATS", "nats://127.0.0.1:4222"),
                   help="NATS server URL(s), comma-separated (default $LLMGW_NATS or the local one)")
    p.add_argument("--db", required=True, help="the SQLite file of the read models")
    p.add_argument("--rebuild", action="store_true", help="build the database afresh from the whole log, then exit")
    p.add_argument(
        "--max-batch", type=int, default=MAX_BATCH, help=f"most events per transaction (default {MAX_BATCH})"
    )
    p.add_argument("--wait-streams", type=float, default=30.0, help="seconds to wait for the log's stream to exist")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    try:
        asyncio.run(_main(args))
    except (ConnectionError, LookupError, TimeoutError, ProjectorFailed) as e:
        sys.exit(f"llmgw projector: {e}")


if __name__ == "__main__":
    main()
