"""The log on NATS JetStream: published (deduplicated by message id, the
control plane fenced on its subjects), followed, read by subject.

Facts learned on this stack (nats-py 2.16, nats-server 2.15), each the reason
for a choice below:
- The log is read through an ordered push consumer (~160k msgs/s here);
  pull `fetch` managed ~23k/s.
- Decisions go out with plain `js.publish`: `publish_async` never resolves a
  publish refused for its expected sequence (nats.py#985).
- A publish that timed out may still have been stored, so it is retried with
  the same Nats-Msg-Id. A retry that carries an expected sequence is refused
  (10071) even when the first attempt landed, so a refused retry is resolved
  by comparing the Msg-Id of the last control message with ours.

A mixin of nats.NatsBus, which owns the attributes it reads.
"""

from __future__ import annotations

import asyncio
import logging

from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError

from . import CONTROL_SUBJECTS, STREAM, BusUnavailable, Fenced, OnMessage, catchup, msgids, roles
from .nats_consumers import _from, _Kept
from .nats_trouble import describe_trouble, is_trouble

log = logging.getLogger("llmgw.bus")

WRONG_LAST_SEQUENCE = 10071
PUBLISH_TRIES = 5
# Below this many messages, the fast reader's consumer set-up is not worth it.
CATCHUP_MIN = 1000


class Log:
    """Publishing on the log, following it, reading it by subject."""

    async def publish(self, subject: str, data: bytes, *, msg_id: str, expect_control_seq: int | None = None) -> int:
        self._may_publish(subject)
        headers = {"Nats-Msg-Id": msg_id}
        if expect_control_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expect_control_seq)
            headers["Nats-Expected-Last-Subject-Sequence-Subject"] = CONTROL_SUBJECTS
        timed_out = False
        last: BaseException | None = None
        for attempt in range(PUBLISH_TRIES):
            try:
                ack = await self.js.publish(subject, data, stream=STREAM, headers=headers)
                if ack.duplicate and not await self._is_ours(ack.seq, subject, data):
                    # Someone published first under our id (issue 35, finding 3):
                    # what it points at is not ours, so ours has not landed.
                    log.warning(
                        "a publish to %s was acked as a duplicate of message %d, which is not ours: "
                        "its id %s was claimed by another publisher; publishing again under a fresh id",
                        subject, ack.seq, msg_id,
                    )  # fmt: skip
                    msg_id = msgids.fresh(msg_id)
                    headers["Nats-Msg-Id"] = msg_id
                    continue
                return ack.seq
            except Exception as e:
                if isinstance(e, APIError) and e.err_code == WRONG_LAST_SEQUENCE:
                    if timed_out:
                        seq = await self._landed(msg_id)
                        if seq:
                            return seq
                    raise Fenced(e.description or "wrong last sequence") from None
                if not is_trouble(e):
                    raise
                timed_out = True
                last = e
                await asyncio.sleep(0.2 * (attempt + 1))
        raise BusUnavailable(
            f"NATS did not take a publish to {subject} in {PUBLISH_TRIES} tries ({describe_trouble(last)}): "
            "the bus is electing a stream leader, or is unreachable"
        )

    def _may_publish(self, subject: str) -> None:
        # The server refuses it anyway (a permissions violation, seen here as
        # a timeout); this says why, at once.
        if self.identity is not None and not roles.may_publish(self.identity.permissions, subject):
            raise PermissionError(f"the credential of {self.identity.describe()} may not publish on {subject}")

    async def _is_ours(self, seq: int, subject: str, data: bytes) -> bool:
        """Whether the log's message `seq` is the one we published (same
        subject, same bytes): what a duplicate ack must point at to count as
        landed. A credential that may not read the log (an agent's, a fleet
        simulator's) takes the ack at its word: its ids are random per
        message (bus/msgids.py), so no one can claim them first."""
        if self.identity is not None and not roles.may_publish(self.identity.permissions, f"$JS.API.STREAM.MSG.GET.{STREAM}"):
            return True
        try:
            msg = await self._retrying("whether a publish landed", lambda: self.js.get_msg(STREAM, seq))
        except NotFoundError:
            return False
        return msg.subject == subject and msg.data == data

    async def _landed(self, msg_id: str) -> int:
        """The sequence of the last control message if it carries `msg_id`."""
        try:
            msg = await self._retrying("whether a publish landed", lambda: self.js.get_last_msg(STREAM, CONTROL_SUBJECTS))
        except NotFoundError:
            return 0
        return msg.seq if (msg.headers or {}).get("Nats-Msg-Id") == msg_id else 0

    async def last_seq(self) -> int:
        try:
            info = await self._retrying("about the log", lambda: self.js.stream_info(STREAM))
        except NotFoundError:
            raise LookupError(f"there is no {STREAM} stream on this NATS: has a control plane run against it?") from None
        return info.state.last_seq

    async def log_id(self) -> str:
        info = await self.js.stream_info(STREAM)
        return f"{STREAM}@{info.created}"

    async def follow(self, start_seq: int, on_message: OnMessage) -> _Kept:
        # A long stretch is read by the fast reader first; nats-py's ordered
        # consumer then follows from where it stopped.
        last = await self.last_seq()
        if last - start_seq >= CATCHUP_MIN and self.nc.connected_url is not None:
            url = self.nc.connected_url.geturl()
            try:
                start_seq = await catchup.read_range(
                    url, STREAM, max(start_seq, 1), last, on_message,
                    creds=self.creds,
                    inbox=self.identity.inbox_prefix if self.identity else "_INBOX",
                ) + 1  # fmt: skip
            except catchup.Unsupported as e:
                log.debug("fast catch-up not possible here: %s", e)
            except catchup.Interrupted as e:
                log.warning("fast catch-up stopped at %d (%s); the client reads the rest", e.delivered, e)
                start_seq = e.delivered + 1
            except (OSError, asyncio.TimeoutError) as e:  # before anything was read
                log.warning("fast catch-up not possible (%s); the client reads it all", e)
        return await self._follow_with_client(start_seq, on_message)

    async def _follow_with_client(self, start_seq: int, on_message: OnMessage) -> _Kept:
        async def subscribe(start: int, deliver):
            async def cb(msg) -> None:
                # The stream sequence is the 6th token of a v1 ack subject
                # ($JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...) and the 8th
                # of a v2 one; parsing it here is cheaper than msg.metadata.
                tokens = msg.reply.split(".")
                deliver(int(tokens[5] if len(tokens) == 9 else tokens[7]), msg)

            return await self.js.subscribe(
                "llmgw.>", stream=STREAM, ordered_consumer=True, config=_from(start), cb=cb, pending_msgs_limit=-1
            )

        async def last() -> int:
            return (await self.js.stream_info(STREAM)).state.last_seq

        def on_msg(seq: int, msg) -> None:
            on_message(seq, msg.subject, msg.data)

        return await _Kept(self, "the log", subscribe, last, on_msg, start_seq).start()

    async def read_matching(self, subjects: str) -> list[tuple[int, str, bytes]]:
        # The server counts the matching messages, so the read knows where it
        # ends (and an empty answer costs no consumer at all).
        try:
            info = await self._retrying("about the log", lambda: self.js.stream_info(STREAM, subjects_filter=subjects))
        except NotFoundError:
            raise LookupError(f"there is no {STREAM} stream on this NATS: has a control plane run against it?") from None
        want = sum((info.state.subjects or {}).values())
        records: list[tuple[int, str, bytes]] = []
        if not want:
            return records
        done = asyncio.Event()

        async def cb(msg) -> None:
            meta = msg.metadata
            records.append((meta.sequence.stream, msg.subject, msg.data))
            if meta.num_pending == 0 or len(records) >= want:
                done.set()

        sub = await self._retrying("a read of the log", lambda: self.js.subscribe(
            subjects, stream=STREAM, ordered_consumer=True, cb=cb, pending_msgs_limit=-1,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        ))  # fmt: skip
        try:
            await done.wait()
        finally:
            await sub.unsubscribe()
        return records
