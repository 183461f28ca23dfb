"""What the event contract's bounds cost per event (core/contract/bounds.py; issue 35).

    python benchmarks/bounds.py [--events N] [--repeat R]

Decodes the mix of the recorded logs (events/logs/*.jsonl, every event of
each, repeated to N events; default 200,000) with the contract as it is
(every number a range, every string a length and a character set, every
list a length: `llmgw.core.contract.events.decode`) and, in the same run, with the
same structs stripped of their constraints (the yardstick: the machine's
speed drifts between runs). Runs alternate, R pairs (default 7), and the
medians are printed: ns per event each way, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import typing
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.core.contract import events as ev  # noqa: E402
from llmgw.replay import logfile  # noqa: E402

_plain: dict[type, type] = {}


def strip(tp):
    """The same type with every msgspec.Meta constraint taken off."""
    origin = get_origin(tp)
    if origin is Annotated:
        return strip(get_args(tp)[0])
    if origin is list:
        return list[strip(get_args(tp)[0])]
    if origin is dict:
        key, value = get_args(tp)
        return dict[strip(key), strip(value)]
    if origin is Union or (origin is not None and origin.__class__.__name__ == "UnionType"):
        return Union[tuple(strip(a) for a in get_args(tp))]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return plain(tp)
    return tp


def plain(cls: type) -> type:
    """A Struct like `cls` (its name, fields, defaults, tag) with no constraint."""
    if cls in _plain:
        return _plain[cls]
    hints = typing.get_type_hints(cls, include_extras=True, globalns=vars(sys.modules[cls.__module__]))
    fields = []
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            default = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            default = msgspec.field(default_factory=f.default_factory)
        else:
            fields.append((f.name, strip(hints[f.name])))
            continue
        fields.append((f.name, strip(hints[f.name]), default))
    cfg = cls.__struct_config__
    _plain[cls] = msgspec.defstruct(
        cls.__name__, fields, kw_only=True, omit_defaults=cfg.omit_defaults, tag_field=cfg.tag_field, tag=cfg.tag,
        gc=False,
    )
    return _plain[cls]


def recorded_mix(events: int) -> list[bytes]:
    one = [data for path in sorted((ROOT / "events" / "logs").glob("*.jsonl")) for _, _, data in logfile.read(path)]
    whole = [d for d in one if _decodes(d)]
    return (whole * (events // len(whole) + 1))[:events]


def _decodes(data: bytes) -> bool:
    try:
        ev.decode(data)
        return True
    except msgspec.MsgspecError:
        return False  # the recorded log's one malformed message: not a decode's cost


def per_event_ns(decode, messages: list[bytes]) -> float:
    began = time.perf_counter()
    for data in messages:
        decode(data)
    return (time.perf_counter() - began) * 1e9 / len(messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    messages = recorded_mix(args.events)
    bounded = ev._decoder.decode
    unbounded = msgspec.json.Decoder(Union[tuple(plain(c) for c in ev.EVENT_TYPES)]).decode
    assert msgspec.to_builtins(unbounded(messages[0])) == msgspec.to_builtins(bounded(messages[0]))
    kinds = sorted({ev.tag_of(type(bounded(m))) for m in set(messages)})
    size = sum(map(len, messages)) / len(messages)
    print(f"{len(messages):,} events of the recorded logs' mix ({len(kinds)} types, {size:.0f} bytes each on average)")
    with_bounds, without = [], []
    for _ in range(args.repeat):
        without.append(per_event_ns(unbounded, messages))
        with_bounds.append(per_event_ns(bounded, messages))
    b, u = statistics.median(with_bounds), statistics.median(without)
    print(f"  decode without constraints (the yardstick): {u:,.0f} ns/event")
    print(f"  decode with the contract's bounds:          {b:,.0f} ns/event")
    print(f"  the bounds cost {b - u:,.0f} ns/event: {b / u:.2f}x the yardstick (medians of {args.repeat} pairs)")
    print("  by type (each alone, the same messages, medians):")
    for kind in kinds:
        alone = [m for m in messages if ev.tag_of(type(bounded(m))) == kind]
        pairs = [(per_event_ns(unbounded, alone), per_event_ns(bounded, alone)) for _ in range(args.repeat)]
        u1, b1 = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        print(f"    {kind:<18} {len(alone) * 100 / len(messages):5.1f}% of the mix  {u1:7,.0f} -> {b1:7,.0f} ns/event "
              f"({b1 / u1:.2f}x)")


if __name__ == "__main__":
    main()
