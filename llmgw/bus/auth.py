"""Who may speak on the bus: NATS decentralized JWT auth, enforced by nats-server.

"Who speaks is in the subject" holds only if a subject is bound to a speaker.
Every component connects as a NATS user of its own (a user JWT signed by an
account key, itself signed by an operator key), and the user JWT carries
the subject permissions of its role. Agents and fleet simulators are users
of the NODES account, gateways, operators and the projector of READERS, the
control plane of the llmgw account (the streams), with a second user in
NODES for its commands: no one but the control plane can make the server
write into the log, the buckets or a command subject (bus/accounts.py says
why and what crosses). nats-server checks them on every
publish and subscription: a forgery is refused with a permissions violation
and never reaches the log. Nothing here enforces anything itself; it only
writes the keys, the JWTs, the `.creds` files and the server's configuration.

Roles and what their credential allows (`permissions`):

    agent N     publish llmgw.agent.N.> and its own heartbeat key; its own
                engine keys (LLMGW_ENGINE_KEYS, keys N.>); subscribe its
                command subject, its logs and test hooks, its own inbox;
                no JetStream API but reading back its own engine keys
    gateway G   publish llmgw.gw.G.>; read the log (the routing table is a
                fold of it) and the engine keys; put and get (by key, never
                list or watch) stored responses (LLMGW_RESPONSES); publish
                its prefix hints on llmgw.hint.G, read every gateway's
    operator    publish llmgw.ctl.>, ask agents for logs; read the log and
                the lease bucket (LLMGW_LEADER: `ctl get leader`)
    control     publish llmgw.control.> (and llmgw.cmd.> with its NODES user), hold the lease
                (LLMGW_LEADER), make the streams (JetStream API; never
                deleting, purging, or changing the log's limits)
    projector   read the log
    console C   the web console: read the log; publish only the actions it
                offers (CONSOLE_ACTIONS), never the catalog, keys or policy
    fleet F     a fleet simulator (`llmgw agent --simulate --fleet N`): many
                simulated nodes over one connection, so it may publish
                llmgw.agent.*.> and every node's heartbeat and engine keys,
                and read every node's commands; nothing else (no ctl, no
                control, no commands, no gateway subjects, no reading the
                log). That a fact names the node of its subject is the fold's
                check (check_origin, core/contract/events/), as for every agent. For
                tests and benchmarks only: it speaks for any node, so a fleet
                of real nodes never holds one (each real agent has its own).

Each user subscribes only under its own inbox prefix (`inbox_prefix`), so
nobody reads another's replies (JetStream acks, request answers).

The key store (`Keystore`) is a folder, `<state dir>/creds` for `llmgw up`:

    keys/*.nk            the NATS operator's and the system, llmgw, nodes and readers accounts' seeds
    issued.json          every credential issued: role, name, public key, when, revoked
    <role>[-<name>].creds  one per credential (NATS .creds: any NATS client uses it)
    server-auth.conf     what nats-server needs: operator, accounts, revocations

All files 0600. A revocation goes into its account's JWT (`revocations`); the
server learns it on a configuration reload (SIGHUP), closes the revoked
user's connections and refuses it from then on.

The rest of who may speak is in modules of its own: each role's subject
permissions (roles.py), the .creds files and their JWTs (credentials.py),
the key store that issues and revokes them and writes the server's
configuration, and which credential a component connects with
(keystore.py). Here: the names and limits of the set-up, and a credential
refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .credentials import Identity

ROLES = ("agent", "gateway", "operator", "control", "projector", "fleet", "console")
# Roles of which a fleet has one each, issued under the role's own name.
SINGLE = {"control": "control", "projector": "projector"}
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Engines' keys (ENGINE_KEYS_BUCKET, keys bus.engine_key_name: <node>.<shard>.<generation>):
# the agent of node N puts only N.> keys and reads back only those, by
# subject ($JS.API.DIRECT.GET.<stream>.<subject>: the bucket is made with
# direct access, KeyValueConfig(direct=True)); gateways read and watch all.
# What the web console may publish: the actions it offers (llmgw/console/server.py `act`: a node's
# labels, hold and release a domain, restart a replica, retry a parked model), each its event's subject
# (subject_for, core/contract/events/; tests/test_console_creds.py checks they are). Nothing else of an
# operator's: not the catalog (model.applied), API keys, policy or facility budgets.
CONSOLE_ACTIONS = (
    "llmgw.ctl.node.labeled", "llmgw.ctl.domain.held", "llmgw.ctl.domain.released",
    "llmgw.ctl.replicas.restart", "llmgw.ctl.model.retry",
)  # fmt: skip
CREDS_ENV = "LLMGW_CREDS"
CA_ENV = "LLMGW_NATS_CA"  # the CA that signed the servers' certificates (tls:// URLs)
TAG_ROLE, TAG_NAME = "llmgw-role:", "llmgw-name:"


@dataclass(frozen=True)
class AuthConfig:
    """Names and limits of the auth set-up, in one place."""

    operator_name: str = "llmgw"
    account_name: str = "LLMGW"
    nodes_account_name: str = "NODES"  # agents and fleet simulators (bus/accounts.py)
    readers_account_name: str = "READERS"  # gateways, operators, the projector (bus/accounts.py)
    system_account_name: str = "SYS"
    creds_dir: str = "creds"  # under the state dir of `llmgw up`
    file_mode: int = 0o600
    dir_mode: int = 0o700
    max_responses: int = 1  # replies a user may send to a request it received (allow_responses)
    local_operator: str = "local"  # the name of the tools' credential, creds/operator.creds
    # The largest message each role may publish (the user JWT's `payload`;
    # -1: the server's own limit, 1 MB). One node stored 54 MB of 900 kB
    # events in 0.2 s (issue 35, finding 6): a node's facts are a few kB
    # (a registration with 64 GPUs is 3 kB), its logs answers are cut to fit
    # (agent/logs.py MAX_ANSWER). The largest catalog event of
    # deploy/catalog.fleet.yaml is 391 bytes (measured): an operator's limit
    # leaves room for catalogs hundreds of times larger. The control plane's
    # decisions grow with the fleet, so it keeps the server's.
    agent_max_payload: int = 64 * 1024  # agents and fleet simulators
    reader_max_payload: int = 64 * 1024  # gateways (their load reports) and the projector (API requests only)
    operator_max_payload: int = 256 * 1024
    control_max_payload: int = -1
    # Consumers the llmgw account may hold at once (the account JWT's
    # `consumer`): readers create only ephemeral ones, which the server
    # deletes once their reader is gone, but any number while connected.
    # Generous for a fleet: each gateway holds ~3, a control plane ~3, each
    # `ctl` command 1 or 2 while it runs.
    max_consumers: int = 10_000
    # The control plane's connection for commands (bus/accounts.py): how long
    # its first connect may take, and a command's flush (a connection gone is
    # an error, the command sent again at the next pass).
    commands_connect_timeout_s: float = 5.0
    command_flush_timeout_s: float = 5.0

    def max_payload(self, role: str) -> int:
        if role in ("agent", "fleet"):
            return self.agent_max_payload
        if role == "operator":
            return self.operator_max_payload
        if role == "control":
            return self.control_max_payload
        return self.reader_max_payload


DEFAULTS = AuthConfig()


class CredentialError(ValueError):
    """A credential asked for that cannot be: bad role or name, unknown, revoked."""


class CredentialRefused(ConnectionError):
    """nats-server refused this credential (revoked, expired, from another operator)."""


def refused_message(who: Identity | None, creds: Path | None, error: object) -> str:
    """What a component says when the server refuses its credential."""
    if creds is None:
        return (
            f"NATS refused an anonymous connection ({error}): this server wants a credential. "
            "Give --creds FILE (or $LLMGW_CREDS); `llmgw creds issue` makes one"
        )
    whom = who.describe() if who else str(creds)
    why = "it was revoked" if "revoked" in str(error).lower() else "it may be revoked, expired, or from another fleet's keys"
    issue = f"llmgw creds issue {who.role} {who.name}" if who else "llmgw creds issue ROLE NAME"
    return f"NATS refused the credential of {whom} ({error}): {why}. Issue a new one (`{issue}`) and give it with --creds"


def is_auth_error(e: BaseException) -> bool:
    """nats-server refused who we are (not what we did: that is a permissions violation)."""
    from nats.errors import AuthorizationError

    text = str(e).lower()
    return isinstance(e, AuthorizationError) or "authorization violation" in text or "authentication" in text


# ----------------------------------------------------------------- a credential refused while running

_refused: list[str] = []
_on_refused: list = []


def when_refused(callback) -> None:
    """Call `callback()` (a service's stop) once a connection's credential is refused."""
    _on_refused.append(callback)


def note_refused(message: str) -> None:
    import logging

    if not _refused:
        logging.getLogger("llmgw.bus").error("%s", message)
    _refused.append(message)
    for callback in _on_refused:
        callback()


def refused() -> str:
    """Why the server refused a credential of this process ("" if it did not)."""
    return _refused[0] if _refused else ""
