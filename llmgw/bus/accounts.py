"""Two accounts: the nodes apart from everything that reads the log.

nats-server 2.15 does not check a push consumer's deliver subject against
its creator's permissions (nats-server#8274; #8279 not merged), and sends a
JetStream API reply (a direct get, a pull's next message, a stream message
get) to whatever reply subject the requester names. So within one account,
any user with JetStream API access can make the server write content of its
choosing onto any subject of that account. When the agents' command
subjects were in the llmgw account, the gateway, operator and projector
credentials (all readers of the log) commanded every node that way: live
replicas stopped, a re-register with term 10^9 locked an agent out of every
genuine command for good, an engine was started on 0.0.0.0 (issue 35,
finding 1). Permissions cannot stop that; an account boundary does: a
subject of one account is not one of another's.

So agents and fleet simulators are users of their own account, NODES, which
has no JetStream at all: no one in it can ask the server to deliver
anything. The command subjects `llmgw.cmd.<node>` are NODES' subjects, and
the one user of NODES that may publish on them is the control plane's
second credential (`<control creds>-commands.creds`, issued with it). What
crosses between the accounts is named here, each direction's exports and
imports in the account JWTs:

    LLMGW -> NODES (services, NODES imports): a node's facts into the log
      (the stream captures them, the JetStream ack comes back on the
      reply), heartbeat puts, engine-key puts and its direct gets.
    NODES -> LLMGW (services, LLMGW imports): operators' log requests to
      agents (`llmgw.agent-logs.<node>`), the simulators' test hooks
      (`llmgw.sim.<node>.*`).
    NODES -> LLMGW (a stream, LLMGW imports): a copy of every command, which
      LLMGW's command stream (COMMAND_STREAM) keeps a while as the record of
      what was sent. A reader delivering into LLMGW's `llmgw.cmd.<node>`
      reaches that copy's subject, not an agent.

Each node's user permissions in NODES still confine it to its own subjects
and keys. What a node credential can still do inside NODES: aim the reply of
its own request (a direct get of its engine key, a fact's ack) at another
node's command subject, whose agent then receives a JetStream answer as if
it were a command. Nothing here refuses that; the command's signature does.
What an LLMGW reader can still do: make the server deliver onto the
imported service subjects, i.e. send a node a logs request or (to a
simulated node) a test hook.
"""

from __future__ import annotations

from pathlib import Path

from . import COMMAND_PREFIX, ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET

LOGS_PREFIX = "llmgw.agent-logs"  # llmgw/agent/logs.py
SIM_PREFIX = "llmgw.sim"  # the simulated agents' test hooks (llmgw.sim.<node>.fail, .silence)
NODE_ROLES = frozenset({"agent", "fleet"})
READER_ROLES = frozenset({"gateway", "operator", "projector"})
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
# ... and, as streams, what its consumers deliver: into its inbox (each
# reader's user may subscribe only its own, bus/auth.py inbox_prefix).
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
        "exports": [_service(s) for s in _distinct((*INTO_THE_LOG, *READER_API, *READER_FACTS))] + [_stream(s) for s in READER_INBOXES],
        "imports": [_import(s, nodes_account) for s in TO_THE_NODES] + [_import(COMMANDS, nodes_account, "stream")],
    }


def readers_crossings(llmgw_account: str, nodes_account: str) -> dict:
    """The imports of the readers' account's JWT (it exports nothing)."""
    return {
        "imports": [_import(s, llmgw_account) for s in (*READER_API, *READER_FACTS)]
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

    from . import auth

    path = commands_creds_path(creds) if creds else None
    if path is None or not path.exists():
        if who is not None and who.role == "control":
            raise PermissionError(
                f"no credential for commands beside {creds} (expected {path}): "
                "issue the control plane's credentials again (`llmgw creds issue control`)"
            )
        return None
    mine = auth.identity(path, foreign_ok=True)
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
