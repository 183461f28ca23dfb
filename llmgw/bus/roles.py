"""Each role's subject permissions on the bus (the user JWT carries them,
nats-server enforces them): what it may publish and subscribe, its own
inbox, and whether a subject is one it may publish on. Roles and what they
allow: bus/auth.py's docstring."""

from __future__ import annotations

from dataclasses import dataclass

from . import (
    COMMAND_PREFIX, COMMAND_STREAM, ENGINE_KEYS_BUCKET, HEARTBEAT_BUCKET, HINTS_PREFIX, LEADER_BUCKET, QUOTAS_BUCKET, RESPONSES_BUCKET,
    STREAM,
)
from . import accounts
from .accounts import LOGS_PREFIX, SIM_PREFIX
from .auth import CONSOLE_ACTIONS, NAME_RE, ROLES, CredentialError


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
            pub_allow=(
                f"llmgw.gw.{name}.>", f"{HINTS_PREFIX}.{name}", *_log_reader(), *_engine_keys_reader(), *_stored_responses(),
                *_shared_limits(),
            ),
            sub_allow=(inbox, f"{HINTS_PREFIX}.*"),
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

