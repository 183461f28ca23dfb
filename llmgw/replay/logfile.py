"""The log as a file: one JSON object per line, for `llmgw replay FILE`,
`--export`, the recorded scenarios under `events/logs/` and the benchmarks.

    {"seq": 7, "subject": "llmgw.agent.n1.shard.status", "data": {...the event...}}

The event is embedded as it was published, byte for byte, so a replay from
the file folds exactly what the live log held. A message that is not JSON at
all (it happens: anything can be published) is kept base64-encoded under
"raw", to be quarantined on replay like it was live.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Iterator

import msgspec

from ..core.simulation.history import Record


class _Line(msgspec.Struct, kw_only=True):
    seq: int
    subject: str
    data: msgspec.Raw = msgspec.Raw()
    raw: str | None = None


_line = msgspec.json.Decoder(_Line)
_json = msgspec.json.Decoder()


def encode_record(seq: int, subject: str, data: bytes) -> bytes:
    head = b'{"seq":%d,"subject":%s,' % (seq, msgspec.json.encode(subject))
    try:
        _json.decode(data)
        if b"\n" in data:
            raise ValueError("multi-line")
        return head + b'"data":' + data + b"}\n"
    except (msgspec.DecodeError, ValueError):
        return head + b'"raw":"' + base64.b64encode(data) + b'"}\n'


def write(path: str | os.PathLike, records: Iterable[Record]) -> int:
    n = 0
    with open(path, "wb") as f:
        for seq, subject, data in records:
            f.write(encode_record(seq, subject, data))
            n += 1
    return n


def read(path: str | os.PathLike) -> list[Record]:
    with open(path, "rb") as f:
        return list(parse(f.read()))


def parse(blob: bytes) -> Iterator[Record]:
    for i, line in enumerate(blob.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = _line.decode(line)
        except msgspec.MsgspecError as e:
            raise ValueError(f"line {i} of the log file is not a log record: {e}") from None
        if len(rec.data):
            yield rec.seq, rec.subject, bytes(rec.data)
        else:
            yield rec.seq, rec.subject, base64.b64decode(rec.raw or "")
