"""The agents' commands on NATS: sent by the control plane (on the
commands' stream, or, when the agents have an account of their own, on the
connection beside ours: bus/accounts.py), followed by an agent on its own
subject.

A mixin of nats.NatsBus, which owns the attributes it reads.
"""

from __future__ import annotations

from . import COMMAND_PREFIX, COMMAND_STREAM, OnCommand, accounts, auth, msgids
from .nats_consumers import _Sub


class Commands:
    """Sending commands to a node, and a node following its own."""

    async def send_command(self, node: str, data: bytes) -> None:
        # A fresh id per send: a re-send is meant to arrive again (agents
        # dedupe by shard and generation), a retried publish is not.
        self._commands_sent += 1
        msg_id = msgids.fresh(f"cmd-{self._instance}-{self._commands_sent}")
        subject, headers = f"{COMMAND_PREFIX}.{node}", {"Nats-Msg-Id": msg_id}
        commander = await self._commander()
        if commander is None:  # one account (no auth): the command stream acks it
            await self.js.publish(subject, data, stream=COMMAND_STREAM, headers=headers)
            return
        # In NODES, where nothing has JetStream: a core publish, flushed so
        # that a connection gone is an error here; the llmgw account's
        # command stream keeps a copy (bus/accounts.py).
        await commander.publish(subject, data, headers=headers)
        await commander.flush(timeout=auth.DEFAULTS.command_flush_timeout_s)

    async def _commander(self):
        """The connection commands go out on when the agents are in an
        account of their own: the credential beside ours (bus/accounts.py).
        None without one."""
        if self._commands_nc is None:
            self._commands_nc = await accounts.connect_commands(self.creds, self.identity, self._commands_opts)
        return self._commands_nc

    async def follow_commands(self, node: str, on_command: OnCommand) -> _Sub:
        # A plain subscription on the node's own subject, not a JetStream
        # consumer: that is all an agent's credential allows (a consumer is
        # created through an API subject whose filter the permission could not
        # bind to its node). Commands sent while it was away are not lost:
        # every reconnect re-registers the node, and the control plane re-sends
        # what is outstanding for a node that registers.
        async def cb(msg) -> None:
            on_command(msg.data)

        sub = await self.nc.subscribe(f"{COMMAND_PREFIX}.{node}", cb=cb)
        return _Sub(sub)
