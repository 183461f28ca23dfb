"""`llmgw creds`: the bus credentials of a fleet (llmgw/bus/auth.py).

    llmgw creds issue agent gpu-7        a node's agent (publishes as llmgw.agent.gpu-7 only)
    llmgw creds issue gateway edge-1     a gateway
    llmgw creds issue operator alice     a person's tools (ctl, replay, projections rebuild)
    llmgw creds list [--json]            every credential issued, live or revoked
    llmgw creds revoke agent gpu-7       the server refuses it; the node is treated as lost
    llmgw creds init --dir DIR           a key store for a fleet's servers (deploy/nats/)
    llmgw creds command-key              the public key agents check commands with (commands.pub)

The key store is `<state dir>/creds` of the local `llmgw up` (found as
`llmgw ctl` finds it), or `--dir`. A revocation is written into the
account JWT of `server-auth.conf`; a local `llmgw up`'s NATS is told to
reload at once, a fleet's servers need that file copied and a reload
(`nats-server --signal reload`). Then `credential.revoked` goes into the log
(as the tools' credential), and the control plane declares a revoked node lost.

Exit status as `llmgw ctl`: 0 done, 1 no such credential, 2 bad input,
3 NATS not reachable or the credential refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from ..bus import accounts, auth, credentials, keystore, msgids, signing

OK, NOT_FOUND, BAD_INPUT, UNREACHABLE = 0, 1, 2, 3


def add_parser(sub) -> None:
    p = sub.add_parser("creds", help="issue, list and revoke the bus credentials of nodes, gateways and operators")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB", help="issue, list, revoke, init or command-key")

    def where(q) -> None:
        q.add_argument("--dir", help="the key store (default: <state dir>/creds of the local llmgw up)")
        q.add_argument("--state-dir", help="the llmgw up state dir whose key store to use")

    issue = verbs.add_parser("issue", help="a new credential (a .creds file) for a node, gateway or operator")
    issue.add_argument("role", choices=auth.ROLES, help=f"whose credential: {', '.join(auth.ROLES)}")
    issue.add_argument("name", nargs="?", help="the node, gateway or operator (control and projector need none)")
    issue.add_argument("-o", "--out", help="where to write it (default: in the key store)")
    where(issue)
    ls = verbs.add_parser("list", help="every credential issued")
    ls.add_argument("--json", action="store_true", help="as JSON, for tools")
    where(ls)
    revoke = verbs.add_parser("revoke", help="the server refuses it from now on; a revoked node is lost")
    revoke.add_argument("role", choices=auth.ROLES, help=f"whose credential: {', '.join(auth.ROLES)}")
    revoke.add_argument("name", help="the node, gateway or operator it was issued to")
    revoke.add_argument("--nats", help="where to record it (default $LLMGW_NATS, else the local llmgw up)")
    revoke.add_argument("--creds", help="the tools' credential to record it with (default as llmgw ctl)")
    where(revoke)
    init = verbs.add_parser("init", help="make a key store (operator and account keys) and its server-auth.conf")
    where(init)
    command_key = verbs.add_parser(
        "command-key", help="print the public key agents check the control plane's commands with (creds/commands.pub)"
    )
    where(command_key)
    p.set_defaults(func=main)


def _store(args) -> keystore.Keystore:
    from ..ctl.locate import DEFAULT_STATE_DIR, find_state_dir

    if args.dir:
        return keystore.Keystore(Path(args.dir))
    state = Path(args.state_dir) if args.state_dir else (find_state_dir() or Path(DEFAULT_STATE_DIR))
    return keystore.Keystore(state / auth.DEFAULTS.creds_dir)


def main(args) -> None:
    try:
        sys.exit(run(args))
    except auth.CredentialError as e:
        print(f"llmgw creds: {e}", file=sys.stderr)
        sys.exit(NOT_FOUND if "no live credential" in str(e) or "no llmgw keys" in str(e) else BAD_INPUT)


def run(args) -> int:
    keys = _store(args)
    if args.verb == "init":
        keys.init()
        print(f"key store: {keys.folder.resolve()}\nserver configuration: {keys.server_conf_path.resolve()} (include it in nats-server.conf)")
        _say_command_key(keys)
        return OK
    if args.verb == "command-key":
        keys.init()  # made if missing (an older key store): idempotent
        print((keys.folder / signing.PUBLIC_FILE).read_text().strip())
        return OK
    if args.verb == "issue":
        path = keys.issue(args.role, args.name, out=Path(args.out) if args.out else None)
        who = credentials.identity(path)
        print(f"{path}\t{who.role} {who.name}\t{who.public_key}")
        commands = accounts.commands_creds_path(path)
        if args.role == "control" and commands.exists():  # its commands, in NODES: keep the two together
            print(f"{commands}\t{who.role} {who.name} (commands)\t{credentials.identity(commands).public_key}")
        return OK
    if args.verb == "list":
        rows = keys.issued()
        if args.json:
            print(json.dumps([r.__dict__ for r in rows], indent=1))
            return OK
        print(f"{'ROLE':<10} {'NAME':<24} {'ACCOUNT':<8} {'ISSUED':<20} {'STATUS':<28} FILE")
        for r in rows:
            status = "revoked " + _when(r.revoked_at) if r.revoked else "live"
            print(f"{r.role:<10} {r.name:<24} {r.account:<8} {_when(r.issued_at):<20} {status:<28} {r.file}")
        return OK
    if args.verb == "revoke":
        return _revoke(args, keys)
    raise AssertionError(args.verb)


def _say_command_key(keys: keystore.Keystore) -> None:
    pub = keys.folder / signing.PUBLIC_FILE
    print(
        f"command key: {pub.read_text().strip()} ({pub.resolve()}: give it to every agent, --command-key or the agent "
        f"file's command_key; the control plane signs with {(keys.keys_dir / signing.SEED_FILE).resolve()}, "
        "its --signing-key)"
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _revoke(args, keys: keystore.Keystore) -> int:
    from ..ctl.locate import locate

    hit = keys.revoke(args.role, args.name)
    print(f"revoked {len(hit)} credential(s) of {args.role} {args.name}: {', '.join(r.public_key for r in hit)}")
    pid_file = keys.folder.parent / "nats" / "nats-server.pid"
    if keystore.reload_server(pid_file):
        print("the local NATS reloaded its configuration: it refuses them now")
    else:
        print(
            f"no local NATS to tell: copy {keys.server_conf_path.resolve()} to every NATS server "
            "and reload it (nats-server --signal reload)"
        )
    where = locate(args.nats, creds=args.creds)
    try:
        asyncio.run(_record(where.nats, where.creds, args.role, args.name, hit[0].public_key))
    except (ConnectionError, TimeoutError, PermissionError, auth.CredentialError) as e:
        print(f"llmgw creds: revoked, but not recorded in the log ({e}); a revoked node is lost once its heartbeat stops", file=sys.stderr)
        return UNREACHABLE
    print("recorded in the log" + (": the control plane treats the node as lost" if args.role == "agent" else ""))
    return OK


async def _record(nats: str, creds, role: str, name: str, key: str) -> None:
    from ..bus.nats import NatsBus
    from ..core.contract import events as ev

    bus = await NatsBus.connect(nats, name="llmgw-creds", creds=creds)
    try:
        event = ev.CredentialRevoked(at=time.time(), role=role, name=name, public_key=key)
        await bus.publish(ev.subject_for(event), ev.encode(event), msg_id=msgids.fresh(f"revoked-{key}"))
    finally:
        await bus.close()


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="llmgw")
    add_parser(p.add_subparsers(dest="command", required=True))
    a = p.parse_args()
    a.func(a)
