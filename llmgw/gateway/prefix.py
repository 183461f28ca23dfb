"""What each replica was recently sent: a prompt's prefix in fixed blocks,
the bounded index of which replica holds which block, and where a prefix
warm nowhere hashes. Pure: no I/O, no clock.

A prompt is the request body from its `"messages"` (chat) or `"prompt"`
(completions) key on, as the client sent it: the same conversation sent
again by the same client is the same bytes (the SDKs write a request's keys
in a fixed order), and a next turn begins with the bytes of the last. Raw
bytes rather than decoded and re-rendered messages, so that what the router
does per request is bounded by what it hashes, not by the body: at most
`max_bytes` from the prompt's start (GatewayConfig.prefix_hash_kib), found
with one `bytes.find` (memchr speed) and hashed in BLOCK_BYTES blocks.

Block i's hash is of everything from the prompt's start to the end of block
i (one BLAKE2b, copied at each block's end), so a block matches only where
everything before it matches too: a prefix, as the engine's cache sees it
(llama.cpp and vLLM keep a prompt's tokens from its start).

The index maps a block's hash to the replicas believed to hold it (at most
MAX_HOLDERS, the latest first), each with the sequence number of the request
that taught it. It is an LRU over blocks, bounded by `max_bytes`
(GatewayConfig.prefix_index_mib) at ENTRY_BYTES a block (measured:
tests/test_prefix.py), so a flood of unique prompts evicts the oldest and
never grows it past its bound. Forgetting is O(1):
- a replica that left the table (stopped, draining, a new generation: a new
  backend, a new `token`) is not among the live tokens a lookup is given, so
  it is forgotten the moment the fold says so; its blocks age out of the LRU;
- a replica whose engines answered requests believed warm with few cached
  tokens, several in a row (choose.Router.answered says why not one), has
  every belief older than the last of them dropped (`drop`: beliefs at or
  below a sequence number no longer count).

Where a prefix warm nowhere goes: weighted rendezvous hashing (highest
random weight, a form of consistent hashing) of its first RING_BYTES over
the replicas' ids, so that every gateway folding the same log sends a new
prefix to the same replica without a word between them (where it is not
spread by load: then the hints tell them, hints.py), and a replica that
joins or leaves moves only its share of prefixes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from hashlib import blake2b

BLOCK_BYTES = 512  # about 128 tokens of English: the granularity a prefix is matched at
RING_BYTES = 1024  # what a prefix warm nowhere is hashed by: its start (a shared system prompt's)
MAX_HOLDERS = 4  # replicas remembered per block: a hot prefix overflowed to a few
# Bytes one block costs the index: OrderedDict's node and slot, an 8-byte
# digest, the holders' tuples (tests/test_prefix.py measures it under this).
ENTRY_BYTES = 400
DIGEST = 8

_KEYS = (b'"messages"', b'"prompt"')


class Prefix:
    """A prompt's blocks: `hashes[i]` is the hash of its first i+1 blocks."""

    __slots__ = ("hashes", "ring", "size")

    def __init__(self, hashes: list[bytes], ring: bytes, size: int) -> None:
        self.hashes = hashes
        self.ring = ring  # what it hashes to when warm nowhere
        self.size = size  # bytes hashed


def prompt_start(body: bytes) -> int:
    """Where the prompt's value begins in a request body (-1: none found)."""
    for key in _KEYS:
        i = body.find(key)
        if i >= 0:
            colon = body.find(b":", i + len(key))
            if colon >= 0:
                return colon + 1
    return -1


def prefix_of(body: bytes, max_bytes: int) -> Prefix | None:
    """The blocks of the request's prompt, at most `max_bytes` of it; None
    when the body has no prompt (an embeddings request) or hashing is off."""
    if max_bytes <= 0:
        return None
    start = prompt_start(body)
    if start < 0:
        return None
    data = memoryview(body)[start : start + max_bytes]
    size = len(data)
    h = blake2b(digest_size=DIGEST)
    hashes = []
    ring = b""
    for i in range(0, size, BLOCK_BYTES):
        h.update(data[i : i + BLOCK_BYTES])
        d = h.digest()
        hashes.append(d)
        if i + BLOCK_BYTES <= RING_BYTES:
            ring = d
    return Prefix(hashes, ring, size)


def rendezvous(ring: bytes, names: list[str], weights: list[float]) -> int:
    """The index of the name `ring` hashes to: weighted highest random weight
    (score weight / -ln(u), u uniform in (0, 1) from the hash of both)."""
    best, best_score = 0, -1.0
    for i, name in enumerate(names):
        u = (int.from_bytes(blake2b(name.encode(), digest_size=8, key=ring).digest(), "big") + 0.5) / 18446744073709551616.0
        score = weights[i] / -math.log(u)
        if score > best_score:
            best, best_score = i, score
    return best


class Index:
    """Which replica (by its backend's `token`) was sent which blocks; an LRU
    over blocks bounded by `max_bytes`."""

    __slots__ = ("entries", "capacity", "seq", "valid_after", "evicted")

    def __init__(self, max_bytes: int) -> None:
        self.entries: OrderedDict[bytes, tuple[tuple[int, int], ...]] = OrderedDict()
        self.capacity = max(1, max_bytes // ENTRY_BYTES)  # blocks
        self.seq = 0  # requests learned so far
        self.valid_after: dict[int, int] = {}  # token -> beliefs at or below this sequence are dropped
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.entries)

    def warm(self, prefix: Prefix, live: set[int] | dict) -> dict[int, int]:
        """Per live token, how many of the prefix's leading blocks it holds (only those with any)."""
        entries, valid_after = self.entries, self.valid_after
        depth: dict[int, int] = {}
        current: set[int] | None = None
        for i, h in enumerate(prefix.hashes):
            holders = entries.get(h)
            if not holders:
                break
            here = {t for t, s in holders if t in live and s > valid_after.get(t, 0)}
            current = here if current is None else current & here
            if not current:
                break
            for t in current:
                depth[t] = i + 1
        return depth

    def learn(self, prefix: Prefix, token: int) -> int:
        """`token`'s replica was sent the prefix: it holds its blocks from now.
        The request's sequence number (what `drop` takes)."""
        self.seq += 1
        seq = self.seq
        entries = self.entries
        mine = (token, seq)
        for h in prefix.hashes:
            holders = entries.get(h)
            if holders is None:
                entries[h] = (mine,)
            else:
                others = tuple(x for x in holders if x[0] != token)
                entries[h] = (mine,) + others[: MAX_HOLDERS - 1]
                entries.move_to_end(h)
        over = len(entries) - self.capacity
        for _ in range(over if over > 0 else 0):
            entries.popitem(last=False)
            self.evicted += 1
        return seq

    def drop(self, token: int, upto: int) -> None:
        """`token`'s replica no longer holds what it was believed to hold
        before request `upto` (its engine said so): those beliefs are dropped."""
        if upto > self.valid_after.get(token, 0):
            self.valid_after[token] = upto

    def forget(self, token: int) -> None:
        """A replica gone for good: nothing more to keep for it (its blocks age out)."""
        self.valid_after.pop(token, None)


class Sessions:
    """Session (a request's `user` or X-Session-Id, per model) -> the token of
    the replica it stays on: an LRU of at most `most` sessions, each kept
    as an 8-byte digest whatever the client sent."""

    __slots__ = ("by_key", "most")

    def __init__(self, most: int) -> None:
        self.by_key: OrderedDict[bytes, int] = OrderedDict()
        self.most = most

    @staticmethod
    def key(model: str, session: str) -> bytes:
        return blake2b(f"{model}\0{session}".encode(errors="replace"), digest_size=DIGEST).digest()

    def get(self, key: bytes) -> int | None:
        return self.by_key.get(key)

    def put(self, key: bytes, token: int) -> None:
        if self.most <= 0:
            return
        by_key = self.by_key
        by_key[key] = token
        by_key.move_to_end(key)
        while len(by_key) > self.most:
            by_key.popitem(last=False)
