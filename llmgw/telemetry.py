"""OpenTelemetry for the shell: where spans go.

The components make spans through the OpenTelemetry API alone (`tracer`);
until `setup` installs a provider they cost next to nothing and go nowhere.
`setup` reads the environment, as OpenTelemetry's own tools do:

    OTEL_TRACES_EXPORTER=console   each span printed as JSON on stderr
    LLMGW_TRACE_FILE=PATH          each span appended to PATH as one JSON line
                                   (for tests, and to keep a run's spans)

An OTLP collector is reached by installing `opentelemetry-exporter-otlp` and
setting OTEL_TRACES_EXPORTER=otlp (its own variables say where).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


class JsonLinesExporter(SpanExporter):
    """Spans as JSON lines in a file: name, ids, times and attributes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for s in spans:
            ctx = s.get_span_context()
            lines.append(json.dumps({
                "name": s.name,
                "trace_id": f"{ctx.trace_id:032x}",
                "span_id": f"{ctx.span_id:016x}",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent else "",
                "start": s.start_time,
                "end": s.end_time,
                "attributes": dict(s.attributes or {}),
                "service": (s.resource.attributes or {}).get("service.name", ""),
            }))
        with self._lock, open(self._path, "a") as f:
            f.write("\n".join(lines) + "\n")
        return SpanExportResult.SUCCESS


def setup(service: str) -> None:
    """Install a provider if the environment asks for spans to go somewhere."""
    exporters: list[SpanExporter] = []
    if os.environ.get("LLMGW_TRACE_FILE"):
        exporters.append(JsonLinesExporter(os.environ["LLMGW_TRACE_FILE"]))
    kind = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if kind == "console":
        exporters.append(ConsoleSpanExporter())
    elif kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # optional package

        exporters.append(OTLPSpanExporter())
    if not exporters:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # flushed at exit
    trace.set_tracer_provider(provider)
