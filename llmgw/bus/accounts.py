"""Three accounts: the log, the nodes, and those who read the log.

nats-server 2.15 does not check a push consumer's deliver subject against
its creator's permissions (nats-server#8274; #8279 not merged), and sends a
JetStream API answer (a direct get, a stream message get, a consumer's
info, a publish's ack) to whatever reply subject the requester names. So
within one account, any user with JetStream API access can make the server
write onto any subject of that account. When everyone was a user of the
llmgw account, the gateway, operator and projector credentials (all readers
of the log) commanded every node that way: live replicas stopped, a
re-register with term 10^9 locked an agent out of every genuine command for
good, an engine was started on 0.0.0.0 (issue 35, finding 1). Aimed at the
log's own subjects, the same answers were stored: a stream message get as
another node's heartbeat or engine key, or as a decision; a direct get of an
engine key (bytes a node chose) as another node's fact. Permissions cannot
stop that; account boundaries do: an answer lands in the requester's
account, and a subject of one account is not one of another's.

    LLMGW    the streams and buckets; the control plane (the one user with
             JetStream API access of its own), a test harness
    NODES    agents and fleet simulators; no JetStream. The command
             subjects `llmgw.cmd.<node>` are its subjects, and the one user
             that may publish on them is the control plane's second
             credential (`<control creds>-commands.creds`, issued with it).
    READERS  gateways, operators, the projector; no JetStream of its own:
             the API a reader uses is imported from LLMGW, so the server's
             answers to it land in READERS, where no stream captures them.

What crosses (the account JWTs' exports and imports):

    LLMGW -> NODES (services): a node's facts into the log (the stream
      captures them, the ack comes back on the reply), heartbeat puts,
      engine-key puts and their direct gets.
    LLMGW -> READERS (services): the readers' JetStream API (stream info,
      ephemeral consumers, message gets, direct gets; no pulls), their
      consumers' flow control, gateways' and operators' facts, gateways'
      stored responses (puts; read by direct get).
    LLMGW -> READERS (streams): what readers' consumers deliver, into
      `_INBOX.<role>.>` (each reader may subscribe only its own inbox).
    NODES -> LLMGW, READERS (services): operators' log requests to agents
      (`llmgw.agent-logs.<node>`), the simulators' test hooks.
    NODES -> LLMGW (a stream): a copy of every command, which LLMGW's
      command stream (COMMAND_STREAM) keeps a while as the record of what
      was sent; a delivery into LLMGW's `llmgw.cmd.<node>` reaches no agent.

An answer delivered to a reply subject reaches that account's subscribers
only, never a service import onward (tried: a node's answers aimed at the
log's subjects through NODES' imports are not stored; a reader's aimed at
NODES' hooks through READERS' imports do not arrive). Each user's
permissions still confine it within its account.

What is left (tests/test_auth_accounts.py tries each):
- A node can aim the answer to its own request (the direct get of its own
  engine key: bytes it chose; a fact's ack) at another node's command
  subject, within NODES. The command's signature refuses it, nothing here.
- A reader's push consumer, which lives in LLMGW, may still deliver onto
  any LLMGW subject: 2.15.1 stores no such delivery in a stream (tried),
  and the only subscribers there are the control plane's and a harness's
  inboxes, whose subjects are random.
"""

from __future__ import annotations

from pathlib import Path

from . import COMMAND_PREFIX, ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET, QUOTAS_BUCKET, RESPONSES_BUCKET

LOGS_PREFIX = "llmgw.agent-logs"  # llmgw/agent/logs.py
SIM_PREFIX = "llmgw.sim"  # the simulated agents' test hooks (llmgw.sim.<node>.fail, .silence)
NODE_ROLES = frozenset({"agent", "fleet"})
READER_ROLES = frozenset({"gateway", "operator", "projector", "console"})
# Which account key signs a user (keys/account.nk, keys/nodes.nk, keys/readers.nk).
LLMGW, NODES, READERS = "llmgw", "nodes", "readers"
COMMANDS_SUFFIX = "-commands"

# What NODES' users reach in LLMGW (LLMGW exports, NODES imports).
INTO_THE_LOG = (
    "llmgw.agent.>",
    f"$KV.{HEARTBEAT_BUCKET}.>",
    f"$KV.{ENGINE_KEYS_BUCKET}.>",
    f"$JS.API.DIRECT.GET.KV_{ENGINE_KEYS_BUCKET}.>",
)
# What LLMGW's and READERS' users reach in NODES (NODES exports, both import).
TO_THE_NODES = (f"{LOGS_PREFIX}.>", f"{SIM_PREFIX}.>")
COMMANDS = f"{COMMAND_PREFIX}.>"
# What READERS' users reach in LLMGW: the JetStream API a reader uses
# (no pulls: no MSG.NEXT), flow control of its consumers, its own facts...
READER_API = (
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.>",
    "$JS.API.CONSUMER.CREATE.>",
    "$JS.API.CONSUMER.INFO.>",
    "$JS.API.CONSUMER.DELETE.>",
    "$JS.API.STREAM.MSG.GET.>",
    "$JS.API.DIRECT.GET.>",
    "$JS.FC.>",
)
READER_FACTS = ("llmgw.gw.>", "llmgw.ctl.>")
# ... and the stored responses' puts (gateway/stored.py; read by direct get,
# in READER_API). Of READERS' users, only gateways may publish there (roles.py).
# And the shared limits' compare-and-set puts (gateway/shared_limits.py).
READER_STORES = (f"$KV.{RESPONSES_BUCKET}.>", f"$KV.{QUOTAS_BUCKET}.>")
# ... and, as streams, what its consumers deliver: into its inbox (each
# reader's user may subscribe only its own, bus/roles.py inbox_prefix).
READER_INBOXES = tuple(f"_INBOX.{role}.>" for role in sorted(READER_ROLES))


def account_of(role: str) -> str:
    if role in NODE_ROLES:
        return NODES
    return READERS if role in READER_ROLES else LLMGW


def commands_creds_path(creds: str | Path) -> Path:
    """The control plane's NODES credential, beside its llmgw one:
    control.creds -> control-commands.creds."""
    p = Path(creds)
    return p.with_name(f"{p.stem}{COMMANDS_SUFFIX}{p.suffix or '.creds'}")


def _service(subject: str) -> dict:
    return {"name": subject, "subject": subject, "type": "service", "response_type": "Singleton"}


def _import(subject: str, account: str, kind: str = "service") -> dict:
    return {"name": subject, "subject": subject, "account": account, "type": kind}


def _stream(subject: str) -> dict:
    return {"name": subject, "subject": subject, "type": "stream"}


def _covers(pattern: str, subject: str) -> bool:
    """Whether `pattern` matches every subject `subject` (a pattern itself) does."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]) or s[i] == ">":
            return False
    return len(p) == len(s)


def _distinct(subjects) -> list[str]:
    """Each subject once, those another covers left out: nats-server refuses
    an account whose exports overlap (and then every user of it)."""
    subjects = list(dict.fromkeys(subjects))
    return [s for s in subjects if not any(o != s and _covers(o, s) for o in subjects)]


def llmgw_crossings(nodes_account: str) -> dict:
    """The exports and imports of the llmgw account's JWT."""
    return {
        "exports": [_service(s) for s in _distinct((*INTO_THE_LOG, *READER_API, *READER_FACTS, *READER_STORES))] + [_stream(s) for s in READER_INBOXES],
        "imports": [_import(s, nodes_account) for s in TO_THE_NODES] + [_import(COMMANDS, nodes_account, "stream")],
    }


def readers_crossings(llmgw_account: str, nodes_account: str) -> dict:
    """The imports of the readers' account's JWT (it exports nothing)."""
    return {
        "imports": [_import(s, llmgw_account) for s in (*READER_API, *READER_FACTS, *READER_STORES)]
        + [_import(s, llmgw_account, "stream") for s in READER_INBOXES]
        + [_import(s, nodes_account) for s in TO_THE_NODES],
    }


def nodes_crossings(llmgw_account: str) -> dict:
    """The exports and imports of the nodes account's JWT."""
    return {
        "exports": [_service(s) for s in TO_THE_NODES] + [_stream(COMMANDS)],
        "imports": [_import(s, llmgw_account) for s in INTO_THE_LOG],
    }


async def connect_commands(creds, who, opts: dict):
    """The control plane's connection in NODES, with the credential beside
    `creds` (connected as `opts` say, which are its llmgw connection's);
    None when there is none and `who` is no control plane (no auth, or a
    harness that sends commands in one account)."""
    import asyncio

    import nats

    from . import auth, credentials

    path = commands_creds_path(creds) if creds else None
    if path is None or not path.exists():
        if who is not None and who.role == "control":
            raise PermissionError(
                f"no credential for commands beside {creds} (expected {path}): "
                "issue the control plane's credentials again (`llmgw creds issue control`)"
            )
        return None
    mine = credentials.identity(path, foreign_ok=True)
    opts = {**opts, "user_credentials": str(path)}
    opts.pop("inbox_prefix", None)
    if mine is not None:
        opts["inbox_prefix"] = mine.inbox_prefix
    try:
        # Bounded: nats-py's first connect with reconnects without end (a
        # process that runs forever) would hold the control plane's pass.
        return await asyncio.wait_for(nats.connect(**opts), auth.DEFAULTS.commands_connect_timeout_s)
    except Exception as e:
        raise ConnectionError(f"cannot connect for commands with {path}: {e or type(e).__name__}") from None
