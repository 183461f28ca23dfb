"""Run the conformance rows against a gateway and print the matrix.

    python -m llmgw.conformance --url http://127.0.0.1:PORT/v1 --key KEY --model MODEL

Each row is an async check that returns an Outcome. A row that raises is a
failure with the exception as its detail: the matrix must never hide one.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import importlib
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

ROW_MODULES = (
    "llmgw.conformance.openai_rows",
    "llmgw.conformance.responses_rows",
    "llmgw.conformance.anthropic_rows",
)


@dataclass(frozen=True)
class Target:
    """Where the rows call. `other_url` is a second gateway over the same
    fleet (stored responses must be found by either); None skips such rows."""

    url: str  # the OpenAI base URL, ending in /v1
    key: str
    model: str
    embed_model: str | None = None
    other_url: str | None = None

    @property
    def root(self) -> str:
        """The gateway's root (Anthropic's SDK adds /v1 itself)."""
        return self.url.removesuffix("/").removesuffix("/v1")


class Verdict(enum.Enum):
    WORKS = "works"
    CLEAR_ERROR = "clear error"
    SKIPPED = "skipped"
    FAILS = "FAILS"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    detail: str = ""


@dataclass(frozen=True)
class Row:
    api: str  # "openai chat", "responses", "anthropic messages", ...
    name: str  # what the row tries, e.g. "tools, tool_choice=required, streamed"
    check: Callable[[Target], Awaitable[Outcome]]


def gather_rows(modules: Sequence[str] = ROW_MODULES) -> list[Row]:
    rows: list[Row] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        rows.extend(module.ROWS)
    return rows


async def run_rows(rows: Sequence[Row], target: Target) -> list[tuple[Row, Outcome]]:
    results = []
    for row in rows:
        try:
            outcome = await row.check(target)
        except Exception as e:  # a row that raises is a failure, shown as such
            outcome = Outcome(Verdict.FAILS, f"{type(e).__name__}: {e}")
        results.append((row, outcome))
    return results


def render(results: Sequence[tuple[Row, Outcome]]) -> str:
    widths = [max([len(r.api) for r, _ in results] + [3]), max([len(r.name) for r, _ in results] + [4])]
    lines = [f"{'API':<{widths[0]}}  {'ROW':<{widths[1]}}  VERDICT      DETAIL"]
    for row, out in results:
        detail = " ".join(out.detail.split())[:160]
        lines.append(f"{row.api:<{widths[0]}}  {row.name:<{widths[1]}}  {out.verdict.value:<11}  {detail}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway's OpenAI base URL, ending in /v1")
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--embed-model")
    parser.add_argument("--other-url", help="a second gateway over the same fleet")
    args = parser.parse_args(argv)
    target = Target(args.url, args.key, args.model, args.embed_model, args.other_url)
    results = asyncio.run(run_rows(gather_rows(), target))
    print(render(results))
    return 1 if any(o.verdict is Verdict.FAILS for _, o in results) else 0


if __name__ == "__main__":
    sys.exit(main())
