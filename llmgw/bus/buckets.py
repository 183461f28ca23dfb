"""KV buckets no writer can roll up or purge.

nats-py makes a bucket's stream with `allow_rollup_hdrs=True` (its KV
`purge` is a publish with `Nats-Rollup: sub`). Rollup is decided by a header
of the message, not by who sends it: one node's credential, allowed to put
its own engine key, published there with `Nats-Rollup: all` and the server
dropped every node's engine keys (every model answered 502 until its
engines restarted); the same header purged every node's heartbeat (issue 35,
finding 2). Subject permissions cannot see headers, so the bucket itself
must refuse them.

So every llmgw bucket is made here, as nats-py would make it but with
rollup headers off, `deny_delete` and `deny_purge`: a delete is a marker
(a put with `KV-Operation: DEL`, which is all nats-py's `delete` is), and
nothing but a whole-stream operation, which no writer may ask for, drops
what a bucket holds. A bucket made by an older llmgw is changed so by the
control plane at its start (`harden`). Nothing of llmgw purges or rolls up
(its lease lets go with a delete marker).
"""

from __future__ import annotations

import dataclasses
import logging

from nats.js.api import DiscardPolicy, KeyValueConfig, StreamConfig
from nats.js.errors import APIError, NotFoundError

log = logging.getLogger("llmgw.bus")

ALREADY_EXISTS = 10058
DUPLICATE_WINDOW_S = 120.0  # nats-py's for a bucket (shortened to its TTL, as nats-py does)


def stream_config(config: KeyValueConfig) -> StreamConfig:
    """The stream of a bucket: nats-py's `create_key_value`, hardened."""
    window = min(DUPLICATE_WINDOW_S, config.ttl) if config.ttl else DUPLICATE_WINDOW_S
    return StreamConfig(
        name=f"KV_{config.bucket}",
        description=config.description,
        subjects=[f"$KV.{config.bucket}.>"],
        allow_direct=config.direct,
        allow_rollup_hdrs=False,
        deny_delete=True,
        deny_purge=True,
        discard=DiscardPolicy.NEW,
        duplicate_window=window,
        max_age=config.ttl,
        max_bytes=config.max_bytes,
        max_consumers=-1,
        max_msg_size=config.max_value_size,
        max_msgs=-1,
        max_msgs_per_subject=config.history,
        num_replicas=config.replicas,
        storage=config.storage,
    )


def hardened(config: StreamConfig) -> bool:
    return not config.allow_rollup_hdrs and bool(config.deny_delete) and bool(config.deny_purge)


async def make(js, config: KeyValueConfig):
    """The bucket, made hardened if missing (left as it is if there); its handle."""
    from nats.js.kv import KeyValue

    try:
        return await js.key_value(config.bucket)
    except NotFoundError:
        pass
    try:
        await js.add_stream(stream_config(config))
    except APIError as e:
        if e.err_code != ALREADY_EXISTS:  # made meanwhile by another process
            raise
        return await js.key_value(config.bucket)
    return KeyValue(name=config.bucket, stream=f"KV_{config.bucket}", pre=f"$KV.{config.bucket}.", js=js, direct=bool(config.direct))


async def harden(js, bucket: str) -> bool:
    """Turn rollup headers off and deletes and purges away on a bucket an
    older llmgw made; True if it had to. Its keys stay as they are."""
    info = await js.stream_info(f"KV_{bucket}")
    if hardened(info.config):
        return False
    log.info("bucket %s allowed rollups or purges (made by an older llmgw): turning them off", bucket)
    await js.update_stream(dataclasses.replace(info.config, allow_rollup_hdrs=False, deny_delete=True, deny_purge=True))
    return True
