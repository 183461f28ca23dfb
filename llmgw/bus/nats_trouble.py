"""What the bus in trouble looks like on NATS (no stream leader during an
election, a server gone, the JetStream API busy): worth trying again, and
never a sign that a stream is missing; and how it is said to an operator."""

from __future__ import annotations

import asyncio

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

# Trying NATS again at start (and the streams, for a process that runs
# forever): from the first pause, doubled up to the longest, without end.
RETRY_FIRST_S = 0.5
RETRY_LONGEST_S = 5.0
STREAM_NOT_FOUND = 10059
# What a bus in trouble answers (no stream leader during an election, a
# server gone): worth trying again, and never a sign that a stream is missing.
TROUBLE = (NatsTimeout, asyncio.TimeoutError, NoRespondersError, NoStreamResponseError, ServiceUnavailableError)


def is_trouble(e: BaseException) -> bool:
    """Whether an error is the bus in trouble (try again) rather than an answer."""
    if isinstance(e, TROUBLE):
        return True
    # 503 and "JetStream system temporarily unavailable" (10008) mid-election;
    # "no suitable peers for placement" (10005) while a server of the cluster
    # is down (a bucket made then: a gateway exited on it when the stream
    # leader was killed). 429 "too many requests": the JetStream API busy
    # under a flood (a `ctl apply` died of it with a traceback: issue 35).
    return isinstance(e, APIError) and (e.code in (503, 429) or e.err_code in (10008, 10005))


def stream_missing(e: BaseException) -> bool:
    return isinstance(e, NotFoundError) and (e.err_code in (STREAM_NOT_FOUND, None) or "not found" in str(e.description))



def describe_trouble(e: BaseException | None) -> str:
    if e is None:
        return "no answer"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text and text != type(e).__name__ else type(e).__name__
