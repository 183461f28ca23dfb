"""A request no SDK would send (malformed JSON, an oversized body), for the
bad-input rows: urllib in a thread, no proxy from the environment (the
gateway under test is reached directly)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, dict | None]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers}, method="POST")
    try:
        with opener.open(req, timeout=timeout) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    except (ConnectionError, OSError):  # a refusal may close before all of an oversized body is sent
        return 0, None
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


async def post(url: str, body: bytes, headers: dict[str, str], timeout: float = 60) -> tuple[int, dict | None]:
    """(status, the answer's JSON or None)."""
    return await asyncio.to_thread(_post, url, body, headers, timeout)
