"""The projector: follow the log and keep the SQLite read models at PATH.

    python -m llmgw.projections --nats URL --db PATH [--rebuild]
    (the same as `llmgw projections run|rebuild`)

It follows the log until SIGINT or SIGTERM and keeps the read models at
PATH; after any crash, run it again and it resumes where its last commit
stands. `--rebuild` builds PATH afresh from the whole log and exits; a
projector running on PATH meanwhile moves over to the new file by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time

from ..bus.auth import CredentialError, CredentialRefused
from ..bus.nats import NatsBus
from .projector import MAX_BATCH, DatabaseReplaced, Projector, ProjectorFailed, rebuild

log = logging.getLogger("llmgw.projections")


async def serve(nats: str, db: str, *, max_batch: int = MAX_BATCH, wait_streams: float = 30.0, creds=None) -> None:
    """Project until SIGINT or SIGTERM; start again on a file a rebuild put at `db`."""
    bus = await NatsBus.connect(nats, name="llmgw-projector", forever=True, creds=creds)  # waits for NATS, saying so
    try:
        await bus.wait_for_streams(timeout=wait_streams)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            try:
                await Projector(bus, db, max_batch=max_batch).run(stop)
            except DatabaseReplaced as e:
                log.info("%s", e)
    finally:
        await bus.close()


async def rebuild_once(nats: str, db: str, *, wait_streams: float = 30.0, creds=None) -> int:
    """Rebuild `db` from the whole log, printing progress on stderr; returns its last sequence."""
    bus = await NatsBus.connect(nats, name="llmgw-rebuild", creds=creds)
    started = time.monotonic()

    def progress(at: int, last: int) -> None:
        rate = at / max(time.monotonic() - started, 1e-9)
        print(f"  rebuilding {db}: event {at} of {last} ({rate:,.0f} events/s)", file=sys.stderr, flush=True)

    try:
        await bus.wait_for_streams(timeout=wait_streams)
        seq = await rebuild(bus, db, progress=progress)
    finally:
        await bus.close()
    took = time.monotonic() - started
    print(f"rebuilt {db} from the log up to event {seq} in {took:.1f}s", flush=True)
    return seq


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m llmgw.projections", description=__doc__.split("\n\n")[0])
    p.add_argument("--nats", default=os.environ.get("LLMGW_NATS", "nats://127.0.0.1:4222"),
                   help="NATS server URL(s), comma-separated (default $LLMGW_NATS or the local one)")
    p.add_argument("--db", required=True, help="the SQLite file of the read models")
    p.add_argument("--creds", help="NATS credential, a .creds file (default $LLMGW_CREDS, else the local llmgw up's)")
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
        from ..bus.keystore import component_creds
        from ..ctl.locate import find_state_dir

        creds, _ = component_creds(args.creds, "projector", "projector", state_dir=find_state_dir())
        args.creds = str(creds) if creds else None
        if args.rebuild:
            asyncio.run(rebuild_once(args.nats, args.db, wait_streams=args.wait_streams, creds=args.creds))
        else:
            asyncio.run(serve(args.nats, args.db, max_batch=args.max_batch, wait_streams=args.wait_streams, creds=args.creds))
    except (CredentialRefused, CredentialError) as e:
        print(f"llmgw projector: {e}", file=sys.stderr)
        sys.exit(3)
    except (ConnectionError, LookupError, TimeoutError, ProjectorFailed) as e:
        sys.exit(f"llmgw projector: {e}")


if __name__ == "__main__":
    main()
