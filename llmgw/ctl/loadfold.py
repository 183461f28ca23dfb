"""`describe model`'s history with its load reports folded, one line per interval.

Why (issue 34): every gateway reports each model's load when it changes, at
most about once a second (ModelLoad), so a served model's history was
mostly "load on smollm2 from gateway …" lines, burying its decisions. Here
the reports of each interval (a minute by default, CliConfig.load_interval_s)
become one line: how many reports, from which gateways, the most requests
in flight and queued that any report said, and the tokens they counted
(prompt, completion). The line stands where the interval's first report
stood; every other event keeps its place.

The read models keep a report's line of words, not its numbers; the numbers
come from the log itself (`reports`, read by the caller). Without them (the
log out of reach) a line still says how many reports came from which
gateways (the subject names the gateway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import datetime as dt

LOAD = "model.load"  # the reports' type in the read models' events


@dataclass
class Interval:
    start: float
    end: float
    first_seq: int
    last_seq: int = 0
    reports: int = 0
    gateways: set[str] = field(default_factory=set)
    in_flight: int = 0  # the most any report said
    queued: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    counted: bool = False  # the numbers came from the log (else only reports and gateways)

    def add(self, seq: int, gateway: str, report: dict | None) -> None:
        self.last_seq, self.reports = seq, self.reports + 1
        self.gateways.add(gateway)
        if report is not None:
            self.counted = True
            self.in_flight = max(self.in_flight, report.get("in_flight", 0))
            self.queued = max(self.queued, report.get("queued", 0))
            self.tokens_in += report.get("tokens_in", 0)
            self.tokens_out += report.get("tokens_out", 0)

    def words(self) -> str:
        gateways = ", ".join(sorted(self.gateways))
        head = (f"load {_clock(self.start)}–{_clock(self.end)}: {self.reports} report"
                f"{'s' if self.reports != 1 else ''} from gateway{'s' if len(self.gateways) != 1 else ''} {gateways}")
        if not self.counted:
            return head
        return (f"{head}; at most {self.in_flight} in flight, {self.queued} queued; "
                f"{self.tokens_in} tokens in, {self.tokens_out} out")

    def as_event(self) -> dict:
        """The interval as a history entry (what -o json shows, and the text's line)."""
        data = {"seq": self.first_seq, "seqs": f"{self.first_seq}-{self.last_seq}" if self.last_seq != self.first_seq
                else str(self.first_seq), "at": self.start, "type": "load.interval", "subject": "",
                "summary": self.words(), "decisions": [],
                "load": {"until": self.end, "reports": self.reports, "gateways": sorted(self.gateways)}}  # fmt: skip
        if self.counted:
            data["load"].update(in_flight=self.in_flight, queued=self.queued, tokens_in=self.tokens_in,
                                tokens_out=self.tokens_out)
        return data


def _clock(at: float) -> str:
    """A time of day, UTC, as the TIME column beside it has it."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%H:%M:%S")


def gateway_of(subject: str) -> str:
    """The gateway a report came from: its subject is llmgw.gw.<gateway>.model.load."""
    parts = subject.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["llmgw", "gw"] else "?"


def fold(history: list[dict], reports: dict[int, dict] | None, interval_s: float) -> list[dict]:
    """The history with its load reports folded into one entry per interval
    (`reports`: each report's numbers by sequence, or None when they could not be read)."""
    out: list[dict] = []
    open_: dict[int, Interval] = {}  # interval number -> its entry, while it fills
    for e in history:
        if e.get("type") != LOAD or e.get("at") is None:
            out.append(e)
            continue
        n = int(e["at"] // interval_s)
        interval = open_.get(n)
        if interval is None:
            interval = open_[n] = Interval(start=n * interval_s, end=(n + 1) * interval_s, first_seq=e["seq"])
            out.append({"_interval": n})  # its place: the first report's
        interval.add(e["seq"], gateway_of(e.get("subject", "")), None if reports is None else reports.get(e["seq"]))
    return [open_[e["_interval"]].as_event() if "_interval" in e else e for e in out]
