"""What every long-running `llmgw` component shares: its NATS URL and
credential found (the flag, the environment, else the local `llmgw up`'s),
its command signer or verifier, logging, and running until a signal, with
one line (never a traceback) and the exit status of the table
(llmgw/ctl/exits.py) when it cannot."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from ..ctl.locate import locate


def _nats_url(args) -> str:
    """--nats, else $LLMGW_NATS, else the local `llmgw up`'s, else the default port."""
    return locate(args.nats).nats


def _fail(message: str, status: int) -> None:
    """One line on stderr, and the exit status of the table (llmgw/ctl/exits.py)."""
    print(message, file=sys.stderr, flush=True)
    sys.exit(status)


def _creds(args):
    """The tools' credential: --creds, else $LLMGW_CREDS, else the local `llmgw up`'s (bus/auth.py)."""
    return locate(args.nats, creds=args.creds).creds


def _component(args, role: str, name: str | None) -> str | None:
    """A component's credential (args.creds) and the name it speaks as; exit 3 if they disagree."""
    from ..bus.auth import CredentialError
    from ..bus.keystore import component_creds
    from ..ctl.locate import find_state_dir

    try:
        creds, name = component_creds(args.creds, role, name, state_dir=find_state_dir())
    except CredentialError as e:
        _fail(f"llmgw {args.command}: {e}", 3)
    args.creds = str(creds) if creds else None
    return name


def _signer(args):
    """The control plane's command-signing key (bus/signing.py); exit 2 if the one given cannot be read."""
    from ..bus import signing
    from ..ctl.locate import find_state_dir

    try:
        return signing.find_signer(args.signing_key, state_dir=find_state_dir())
    except signing.CommandKeyError as e:
        _fail(f"llmgw {args.command}: {e}", 2)


def _verifier(args, from_agent_file: str = ""):
    """An agent's command key (bus/signing.py find_verifier); exit 2 if the one given cannot be read."""
    from ..bus import signing
    from ..ctl.locate import find_state_dir

    try:
        return signing.find_verifier(args.command_key, from_agent_file, state_dir=find_state_dir())
    except signing.CommandKeyError as e:
        _fail(f"llmgw {args.command}: {e}", 2)


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def _run_until_signalled(main_coro_factory) -> None:
    """Run an async service until SIGINT or SIGTERM, then let it stop cleanly."""

    from ..bus import auth

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        auth.when_refused(stop.set)  # a credential revoked while running: stop, then exit 3
        await main_coro_factory(stop)

    try:
        asyncio.run(runner())
    except (auth.CredentialRefused, auth.CredentialError) as e:
        _fail(f"llmgw: {e}", 3)  # (a ConnectionError too: said first, with what to do)
    except (ConnectionError, LookupError, TimeoutError) as e:
        _fail(f"llmgw: {e}", 3)  # NATS or its streams unreachable (llmgw/ctl/exits.py)
    except Exception as e:  # one line for people; the traceback with -v
        logging.getLogger("llmgw").debug("fatal", exc_info=True)
        if auth.refused():  # what the connection closing made fail
            print(f"llmgw: {auth.refused()}", file=sys.stderr)
            sys.exit(3)
        if isinstance(e, (ConnectionError, LookupError, TimeoutError)):
            sys.exit(f"llmgw: {e}")
        sys.exit(f"llmgw: {type(e).__name__}: {e}")
    if auth.refused():
        print(f"llmgw: {auth.refused()}", file=sys.stderr)
        sys.exit(3)


def default_node_name() -> str:
    """This machine's host name, as a node name (letters, digits, _ and -)."""
    import re
    import socket

    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname().split(".")[0])[:64]
    return name or "node"
