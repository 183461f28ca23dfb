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
                list or watch) stored responses (LLMGW_RESPONSES)
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
                check (core/events.py check_origin), as for every agent. For
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
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import COMMAND_PREFIX, COMMAND_STREAM, ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET, LEADER_BUCKET, QUOTAS_BUCKET, RESPONSES_BUCKET, STREAM, signing
from . import accounts
from .accounts import LOGS_PREFIX, SIM_PREFIX

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
# (core/events.py subject_for; tests/test_console_creds.py checks they are). Nothing else of an
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


# ----------------------------------------------------------------- permissions


@dataclass(frozen=True)
class Permissions:
    pub_allow: tuple[str, ...]
    sub_allow: tuple[str, ...]
    pub_deny: tuple[str, ...] = ()
    responses: bool = False  # may answer requests (the reply subject is allowed once)


def inbox_prefix(role: str, name: str) -> str:
    """Where a user's replies arrive: its own, so no one else can read them."""
    return f"_INBOX.{role}.{name}"


def _reader(stream: str) -> tuple[str, ...]:
    """Read a stream through consumers of one's own: ordered push consumers
    (nats-py's, the fast reader's), their flow control, stream info.

    Ephemeral consumers only: `CONSUMER.CREATE.<stream>` with no name is
    what nats-py's ordered consumers and KV watchers (and catchup.py) ask,
    and the server refuses a durable name there; the named and durable
    create subjects (`CONSUMER.CREATE.<stream>.<name>[.<filter>]`,
    `CONSUMER.DURABLE.CREATE.>`) are not allowed. Readers made durable
    consumers without limit, kept forever (issue 35, finding 9)."""
    api = "$JS.API"
    return (
        f"{api}.STREAM.INFO.{stream}",
        f"{api}.CONSUMER.CREATE.{stream}",
        f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.CONSUMER.DELETE.{stream}.>",
        f"$JS.FC.{stream}.>",
    )


def _log_reader() -> tuple[str, ...]:
    # wait_for_streams looks for the command stream and the heartbeat bucket
    # too: their info (sizes, never content).
    return (
        "$JS.API.INFO",
        *_reader(STREAM),
        # one message by its sequence: whether a duplicate ack points at our
        # own message (NatsBus._is_ours); nothing the log's reader cannot read anyway
        f"$JS.API.STREAM.MSG.GET.{STREAM}",
        f"$JS.API.STREAM.INFO.{COMMAND_STREAM}",
        f"$JS.API.STREAM.INFO.KV_{HEARTBEAT_BUCKET}",
    )


def _bucket_reader(bucket: str) -> tuple[str, ...]:
    """Read a KV bucket: its keys (a consumer of one's own) and its values."""
    kv = f"KV_{bucket}"
    return (
        *_reader(kv),
        f"$JS.API.STREAM.MSG.GET.{kv}",
        f"$JS.API.DIRECT.GET.{kv}",
        f"$JS.API.DIRECT.GET.{kv}.>",
    )


def _engine_keys_reader() -> tuple[str, ...]:
    return _bucket_reader(ENGINE_KEYS_BUCKET)


def _stored_responses() -> tuple[str, ...]:
    """Stored responses (gateway/stored.py): a put, and a get of one key by
    its subject. No consumer on the bucket: a gateway never lists them."""
    return (f"$KV.{RESPONSES_BUCKET}.>", f"$JS.API.DIRECT.GET.KV_{RESPONSES_BUCKET}.$KV.{RESPONSES_BUCKET}.>")


def _shared_limits() -> tuple[str, ...]:
    """The gateways' shared limits (gateway/shared_limits.py): a compare-and-set
    put, and a get of one counter by its subject. No consumer on the bucket."""
    return (f"$KV.{QUOTAS_BUCKET}.>", f"$JS.API.DIRECT.GET.KV_{QUOTAS_BUCKET}.$KV.{QUOTAS_BUCKET}.>")


def permissions(role: str, name: str) -> Permissions:
    check_name(role, name)
    inbox = f"{inbox_prefix(role, name)}.>"
    if role == "agent":
        kv = f"KV_{ENGINE_KEYS_BUCKET}"
        return Permissions(
            pub_allow=(
                f"llmgw.agent.{name}.>",
                f"$KV.{HEARTBEAT_BUCKET}.{name}",
                f"$KV.{ENGINE_KEYS_BUCKET}.{name}.>",
                # its own engine keys read back, by subject (the last message of each)
                f"$JS.API.DIRECT.GET.{kv}.$KV.{ENGINE_KEYS_BUCKET}.{name}.>",
            ),
            sub_allow=(f"{COMMAND_PREFIX}.{name}", f"{LOGS_PREFIX}.{name}", f"{SIM_PREFIX}.{name}.>", inbox),
            responses=True,
        )
    if role == "fleet":
        kv = f"KV_{ENGINE_KEYS_BUCKET}"
        return Permissions(
            pub_allow=(
                "llmgw.agent.*.>",
                f"$KV.{HEARTBEAT_BUCKET}.*",
                f"$KV.{ENGINE_KEYS_BUCKET}.*.>",
                f"$JS.API.DIRECT.GET.{kv}.$KV.{ENGINE_KEYS_BUCKET}.>",
            ),
            sub_allow=(f"{COMMAND_PREFIX}.*", f"{LOGS_PREFIX}.*", f"{SIM_PREFIX}.*.>", inbox),
            responses=True,
        )
    if role == "gateway":
        return Permissions(
            pub_allow=(f"llmgw.gw.{name}.>", *_log_reader(), *_engine_keys_reader(), *_stored_responses(), *_shared_limits()),
            sub_allow=(inbox,),
        )
    if role == "operator":
        return Permissions(
            pub_allow=(
                "llmgw.ctl.>",
                f"{LOGS_PREFIX}.*",
                f"{SIM_PREFIX}.*.fail",
                f"{SIM_PREFIX}.*.silence",  # a simulated node falls silent (its machine lost), or speaks again
                *_log_reader(),
                *_bucket_reader(LEADER_BUCKET),  # `ctl get leader`: who holds the lease, how far standbys follow
            ),
            sub_allow=(inbox,),
        )
    if role == "control":
        return Permissions(
            # (the lease: create, update and delete in its bucket, by subject)
            # Commands go out through its second credential, in NODES
            # (commands_permissions, bus/accounts.py): here they reach no agent.
            pub_allow=("llmgw.control.>", f"$KV.{LEADER_BUCKET}.>", "$JS.API.>", "$JS.FC.>"),
            # It makes the streams, but the log is forever: no deleting, no purging,
            # no changing the log's limits (which could discard its history).
            pub_deny=(
                "$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>", "$JS.API.STREAM.MSG.DELETE.>",
                f"$JS.API.STREAM.UPDATE.{STREAM}",
            ),  # fmt: skip
            sub_allow=(inbox,),
        )
    if role == "projector":
        return Permissions(pub_allow=_log_reader(), sub_allow=(inbox,))
    if role == "console":
        # Its own (issue 35, finding 9: it acted with the operator's, so a hole in
        # it could rewrite the catalog): it reads the log it shows, and publishes
        # only the actions it offers.
        return Permissions(pub_allow=(*_log_reader(), *CONSOLE_ACTIONS), sub_allow=(inbox,))
    raise CredentialError(f"no such role {role!r}: one of {', '.join(ROLES)}")


def commands_permissions(name: str) -> Permissions:
    """The control plane's user in NODES: commands, and nothing else."""
    # (its inbox is named as its llmgw user's: another account, so no one else's)
    return Permissions(pub_allow=(accounts.COMMANDS,), sub_allow=(f"{inbox_prefix('control', name)}.>",))


def check_name(role: str, name: str) -> None:
    if role not in ROLES:
        raise CredentialError(f"no such role {role!r}: one of {', '.join(ROLES)}")
    if not NAME_RE.match(name or ""):
        raise CredentialError(f"a {role} name is letters, digits, _ and - (at most 64), not {name!r}")


def may_publish(perms: Permissions, subject: str) -> bool:
    """The server's rule, for a clear error before the server's refusal."""
    return any(_matches(p, subject) for p in perms.pub_allow) and not any(_matches(p, subject) for p in perms.pub_deny)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


# ----------------------------------------------------------------- .creds files


@dataclass(frozen=True)
class Identity:
    """Who a .creds file says its holder is."""

    role: str
    name: str
    public_key: str
    path: Path

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.role, self.name)

    @property
    def permissions(self) -> Permissions:
        return permissions(self.role, self.name)

    def describe(self) -> str:
        return f"{self.role} {self.name} ({self.path})"


_CREDS_RE = re.compile(r"-----BEGIN NATS USER JWT-----\s*(\S+)\s*-+END NATS USER JWT-+.*?-----BEGIN USER NKEY SEED-----\s*(\S+)\s*", re.S)


def read_creds(path: str | os.PathLike) -> tuple[str, str]:
    """(user JWT, nkey seed) of a .creds file; a clear error when it is not one."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CredentialError(f"cannot read the credential {path}: {e.strerror}") from None
    m = _CREDS_RE.search(text)
    if not m:
        raise CredentialError(f"{path} is not a NATS .creds file (a user JWT and an nkey seed)")
    return m.group(1), m.group(2)


def jwt_claims(token: str) -> dict:
    """The payload of a JWT, unverified (the server verifies; this says who it is for)."""
    try:
        part = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError) as e:
        raise CredentialError(f"not a JWT: {e}") from None


def identity(path: str | os.PathLike, *, foreign_ok: bool = False) -> Identity | None:
    """Who a credential llmgw issued is for. `foreign_ok`: None for a NATS
    credential of someone else's making (used as it is, with no llmgw role)."""
    token, _ = read_creds(path)
    claims = jwt_claims(token)
    tags = (claims.get("nats") or {}).get("tags") or []
    role = next((t[len(TAG_ROLE) :] for t in tags if t.startswith(TAG_ROLE)), "")
    name = next((t[len(TAG_NAME) :] for t in tags if t.startswith(TAG_NAME)), "")
    if role not in ROLES or not name:
        if foreign_ok:
            return None
        raise CredentialError(f"{path} is a NATS credential, but not one llmgw issued (no llmgw role in it)")
    return Identity(role=role, name=name, public_key=claims.get("sub", ""), path=Path(path))


def sign_nonce(seed: str, nonce: str) -> str:
    """The CONNECT `sig` for a server's nonce (as nats-py computes it)."""
    import nkeys

    kp = nkeys.from_seed(seed.encode())
    try:
        return base64.b64encode(kp.sign(nonce.encode())).decode()
    finally:
        kp.wipe()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode_jwt(claims: dict, signer) -> str:
    """A NATS JWT (header, claims, ed25519-nkey signature), as nats-io/jwt v2 writes them.

    Written here, on `nkeys` alone: the `nats-jwt` package (0.2.2) drops an
    account's `revocations` when it encodes, and a revocation the server
    never sees is none."""
    import hashlib

    claims = {"iat": int(time.time()), **claims, "iss": signer.public_key.decode()}
    claims.pop("jti", None)
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    claims["jti"] = base64.b32encode(hashlib.new("sha512_256", body).digest()).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signed = f"{header}.{payload}"
    return f"{signed}.{_b64(signer.sign(signed.encode()))}"


def _new_key(prefix: int):
    import nkeys

    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _write_private(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def creds_text(jwt: str, seed: str) -> str:
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


# ----------------------------------------------------------------- the key store


@dataclass
class Issued:
    role: str
    name: str
    public_key: str
    file: str
    issued_at: float
    revoked_at: float = 0.0
    account: str = accounts.LLMGW  # whose key signed it (bus/accounts.py); rows before the split: llmgw

    @property
    def revoked(self) -> bool:
        return self.revoked_at > 0


@dataclass
class Keystore:
    """The operator's and account's keys and every credential issued, in one folder."""

    folder: Path
    config: AuthConfig = field(default_factory=AuthConfig)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)

    # -- files

    @property
    def keys_dir(self) -> Path:
        return self.folder / "keys"

    @property
    def registry_path(self) -> Path:
        return self.folder / "issued.json"

    @property
    def server_conf_path(self) -> Path:
        return self.folder / "server-auth.conf"

    def exists(self) -> bool:
        return (self.keys_dir / "account.nk").exists()

    def _seed(self, which: str, create) -> "object":
        import nkeys

        path = self.keys_dir / f"{which}.nk"
        if not path.exists():
            kp = create()
            _write_private(path, kp.seed.decode() + "\n", self.config.file_mode)
        return nkeys.from_seed(path.read_text().strip().encode())

    def init(self) -> "Keystore":
        """Make the keys and the server's configuration, or keep those there (idempotent)."""
        import nkeys

        def create_operator_pair():
            return _new_key(nkeys.PREFIX_BYTE_OPERATOR)

        def create_account_pair():
            return _new_key(nkeys.PREFIX_BYTE_ACCOUNT)

        self.folder.mkdir(parents=True, exist_ok=True)
        self.keys_dir.mkdir(exist_ok=True)
        os.chmod(self.folder, self.config.dir_mode)
        os.chmod(self.keys_dir, self.config.dir_mode)
        self._seed("operator", create_operator_pair)
        self._seed("system", create_account_pair)
        self._seed("account", create_account_pair)
        self._seed("nodes", create_account_pair)
        self._seed("readers", create_account_pair)
        # The control plane's command-signing key, its public key beside the credentials (bus/signing.py).
        signing.ensure_key(self.keys_dir, self.folder, self.config.file_mode)
        self.write_server_conf()
        return self

    def _require(self) -> None:
        if not self.exists():
            raise CredentialError(f"no llmgw keys in {self.folder}: `llmgw up` makes them (or `llmgw creds init`)")

    def account_public_key(self) -> str:
        self._require()
        return self._seed("account", None).public_key.decode()

    # -- JWTs

    def _operator_jwt(self, okp, system_pub: str) -> str:
        nats = {"type": "operator", "version": 2, "system_account": system_pub}
        return encode_jwt({"sub": okp.public_key.decode(), "name": self.config.operator_name, "nats": nats}, okp)

    def _account_jwt(self, okp, akp, name: str, *, jetstream: bool, revocations: dict[str, int], crossings: dict | None = None) -> str:
        limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}
        if jetstream:
            limits.update(mem_storage=-1, disk_storage=-1, streams=-1, consumer=self.config.max_consumers)
        nats: dict = {"type": "account", "version": 2, "limits": limits, **(crossings or {})}
        if revocations:
            # A user JWT issued at or before its key's time here is refused.
            nats["revocations"] = dict(sorted(revocations.items()))
        return encode_jwt({"sub": akp.public_key.decode(), "name": name, "nats": nats}, okp)

    def _kept(self, file: str, make) -> str:
        path = self.keys_dir / file
        if not path.exists():
            _write_private(path, make() + "\n", self.config.file_mode)
        return path.read_text().strip()

    def server_conf(self) -> str:
        """The part of nats-server's configuration that turns auth on."""
        import nkeys

        self._require()
        okp = self._seed("operator", None)
        skp = self._seed("system", None)
        akp = self._seed("account", None)
        # (made here for a store from before the split)
        nkp = self._seed("nodes", lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        rkp = self._seed("readers", lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        revoked: dict[str, dict[str, int]] = {accounts.LLMGW: {}, accounts.NODES: {}, accounts.READERS: {}}
        for i in self.issued():
            if i.revoked:
                revoked.setdefault(i.account, {})[i.public_key] = int(i.revoked_at) + 1
        sys_pub, acc_pub, nodes_pub, readers_pub = (k.public_key.decode() for k in (skp, akp, nkp, rkp))
        # Signed once and kept: nats-server reloads no change to its trusted
        # operator, and only the account's JWT (its revocations) ever changes.
        operator = self._kept("operator.jwt", lambda: self._operator_jwt(okp, sys_pub))
        system = self._kept(
            "system.jwt", lambda: self._account_jwt(okp, skp, self.config.system_account_name, jetstream=False, revocations={})
        )
        account = self._account_jwt(
            okp, akp, self.config.account_name, jetstream=True, revocations=revoked[accounts.LLMGW],
            crossings=accounts.llmgw_crossings(nodes_pub),
        )  # fmt: skip
        # No JetStream in NODES: none of its users can ask the server to deliver anything.
        nodes = self._account_jwt(
            okp, nkp, self.config.nodes_account_name, jetstream=False, revocations=revoked[accounts.NODES],
            crossings=accounts.nodes_crossings(acc_pub),
        )  # fmt: skip
        # Nor in READERS: the server's answers to a reader's requests land
        # there, where no stream captures them (bus/accounts.py).
        readers = self._account_jwt(
            okp, rkp, self.config.readers_account_name, jetstream=False, revocations=revoked[accounts.READERS],
            crossings=accounts.readers_crossings(acc_pub, nodes_pub),
        )  # fmt: skip
        return (
            "# Written by llmgw (llmgw/bus/auth.py): decentralized JWT auth.\n"
            "# No anonymous connections: every client presents a user JWT of the\n"
            f"# {self.config.account_name} account, or of {self.config.nodes_account_name} (agents: bus/accounts.py),\n"
            "# whose permissions the server enforces.\n"
            f'operator: "{operator}"\n'
            f"system_account: {sys_pub}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  {sys_pub}: "{system}"\n'
            f'  {acc_pub}: "{account}"\n'
            f'  {nodes_pub}: "{nodes}"\n'
            f'  {readers_pub}: "{readers}"\n'
            "}\n"
        )

    def write_server_conf(self) -> Path:
        _write_private(self.server_conf_path, self.server_conf(), self.config.file_mode)
        return self.server_conf_path

    # -- credentials

    def issued(self) -> list[Issued]:
        try:
            rows = json.loads(self.registry_path.read_text())
        except FileNotFoundError:
            return []
        except ValueError as e:
            raise CredentialError(f"{self.registry_path} is damaged: {e}") from None
        return [Issued(**r) for r in rows]

    def _save(self, rows: list[Issued]) -> None:
        _write_private(self.registry_path, json.dumps([r.__dict__ for r in rows], indent=1) + "\n", self.config.file_mode)

    def file_for(self, role: str, name: str) -> Path:
        if role == "operator" and name == self.config.local_operator:
            return self.folder / "operator.creds"
        if SINGLE.get(role) == name:
            return self.folder / f"{role}.creds"
        return self.folder / f"{role}-{name}.creds"

    def _locked(self):
        """One writer of the store at a time (components started together each issue theirs)."""
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def hold():
            fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, self.config.file_mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

        return hold()

    def issue(self, role: str, name: str | None = None, *, out: Path | None = None) -> Path:
        """A new credential (a new key: an old one of that name stays valid until revoked)."""
        self._require()
        with self._locked():
            return self._issue(role, name, out=out)

    def _issue(self, role: str, name: str | None = None, *, out: Path | None = None) -> Path:
        import nkeys

        self._require()
        name = name or SINGLE.get(role) or (self.config.local_operator if role == "operator" else "")
        perms = permissions(role, name)  # checks role and name
        path = Path(out) if out else self.file_for(role, name)
        account = accounts.account_of(role)
        rows = self.issued()
        rows.append(self._user(role, name, perms, account, path))
        if role == "control":  # its second credential, in NODES: commands
            rows.append(self._user(role, name, commands_permissions(name), accounts.NODES, accounts.commands_creds_path(path)))
        self._save(rows)
        return path

    def _user(self, role: str, name: str, perms: Permissions, account: str, path: Path) -> Issued:
        """A user of `account` (signed by its key) with those permissions, written to `path`."""
        import nkeys

        key = {accounts.NODES: "nodes", accounts.READERS: "readers"}.get(account, "account")
        akp = self._seed(key, lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        ukp = _new_key(nkeys.PREFIX_BYTE_USER)
        pub: dict = {"allow": list(perms.pub_allow)}
        if perms.pub_deny:
            pub["deny"] = list(perms.pub_deny)
        nats: dict = {
            "type": "user", "version": 2, "pub": pub, "sub": {"allow": list(perms.sub_allow)},
            "subs": -1, "data": -1, "payload": self.config.max_payload(role),
            "tags": [f"{TAG_ROLE}{role}", f"{TAG_NAME}{name}"],
        }  # fmt: skip
        if perms.responses:
            nats["resp"] = {"max": self.config.max_responses, "ttl": 0}
        token = encode_jwt({"sub": ukp.public_key.decode(), "name": f"llmgw-{role}-{name}", "nats": nats}, akp)
        _write_private(path, creds_text(token, ukp.seed.decode()), self.config.file_mode)
        return Issued(role=role, name=name, public_key=ukp.public_key.decode(), file=str(path.resolve()), issued_at=time.time(), account=account)

    def issue_unrestricted(self, path: Path) -> Path:
        """A credential that may publish and read anything: for a test harness
        or a benchmark that loads a recorded log (every speaker's events at
        once). It has no llmgw role, so no component accepts it as its own;
        never give one to a component, and keep it out of a fleet. Beside it,
        the same in NODES (accounts.commands_creds_path): a bus connected
        with it sends commands there, as a control plane does."""
        import nkeys

        self._require()
        for key, out in (("account", Path(path)), ("nodes", accounts.commands_creds_path(path))):
            user = _new_key(nkeys.PREFIX_BYTE_USER)
            nats = {"type": "user", "version": 2, "pub": {"allow": [">"]}, "sub": {"allow": [">"]}, "subs": -1, "data": -1, "payload": -1}
            token = encode_jwt({"sub": user.public_key.decode(), "name": "llmgw-unrestricted", "nats": nats}, self._seed(key, None))
            _write_private(out, creds_text(token, user.seed.decode()), self.config.file_mode)
        return Path(path)

    def ensure(self, role: str, name: str | None = None) -> Path:
        """The credential of that role and name in this store, issued if there is none usable."""
        name = name or SINGLE.get(role) or (self.config.local_operator if role == "operator" else "")
        self._require()
        with self._locked():
            return self._ensure(role, name)

    def _ensure(self, role: str, name: str) -> Path:
        path = self.file_for(role, name)
        # Each file present, live, and of its role's account (one issued
        # before the accounts were split is issued again).
        wanted = [(path, accounts.account_of(role))]
        if role == "control":
            wanted.append((accounts.commands_creds_path(path), accounts.NODES))
        live = {(i.public_key, i.account) for i in self.issued() if not i.revoked}
        if all(self._holds(p, account, live) for p, account in wanted):
            return path
        return self._issue(role, name)

    @staticmethod
    def _holds(path: Path, account: str, live: set) -> bool:
        try:
            return path.exists() and (identity(path).public_key, account) in live
        except CredentialError:
            return False

    def revoke(self, role: str, name: str) -> list[Issued]:
        """Revoke every live credential of that role and name; returns them.
        The server learns it when it reloads the configuration (`reload_server`)."""
        check_name(role, name)
        self._require()
        with self._locked():
            return self._revoke(role, name)

    def _revoke(self, role: str, name: str) -> list[Issued]:
        rows = self.issued()
        hit = [r for r in rows if r.role == role and r.name == name and not r.revoked]
        if not hit:
            raise CredentialError(f"no live credential for {role} {name} in {self.folder}")
        now = time.time()
        for r in hit:
            r.revoked_at = now
        self._save(rows)
        self.write_server_conf()
        for r in hit:
            Path(r.file).unlink(missing_ok=True)
        return hit


def reload_server(pid_file: Path) -> bool:
    """Ask a local nats-server to read its configuration again (SIGHUP): how it
    learns a revocation. False when no server runs from that pid file."""
    import signal

    try:
        pid = int(Path(pid_file).read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True


# ----------------------------------------------------------------- finding one's credential


def find_creds(given: str | None, *, state_dir: Path | None) -> Path | None:
    """--creds, else $LLMGW_CREDS, else the local `llmgw up`'s tools' credential."""
    if given:
        return Path(given)
    env = os.environ.get(CREDS_ENV)
    if env:
        return Path(env)
    if state_dir is not None:
        local = state_dir / DEFAULTS.creds_dir / "operator.creds"
        if local.exists():
            return local
    return None


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


def speaker(creds: str | os.PathLike | None, role: str, name: str | None) -> str | None:
    """The name a component speaks as: `name` if given, else its credential's;
    a credential of another role or name is an error that says so."""
    if creds is None:
        return name
    who = identity(creds)
    if who.role != role:
        raise CredentialError(f"{creds} is the credential of {who.role} {who.name}, not of a {role}")
    if name and name != who.name:
        raise CredentialError(
            f"{creds} is the credential of {role} {who.name}, not of {name}: give that one's (`llmgw creds issue {role} {name}`)"
        )
    return who.name


def component_creds(given: str | None, role: str, name: str | None, *, state_dir: Path | None) -> tuple[Path | None, str | None]:
    """(credential, name) a component connects with.

    `--creds` (or $LLMGW_CREDS) when given: its name is the credential's, and
    a `name` that differs is an error. Else, in a folder of a local `llmgw up`
    (its key store under `<state dir>/creds`), the credential of that role and
    name from there, issued on first use: on one machine no one has to think
    about credentials. Else none (a server without auth)."""
    explicit = given or os.environ.get(CREDS_ENV)
    if explicit:
        return Path(explicit), speaker(explicit, role, name)
    if state_dir is not None and name:
        keys = Keystore(state_dir / DEFAULTS.creds_dir)
        if keys.exists():
            return keys.ensure(role, name), name
    return None, name
