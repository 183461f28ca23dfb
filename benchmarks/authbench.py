"""Auth for the benchmarks: the same server set-up as `llmgw up` (bus/auth.py),
and a loader credential that may publish a recorded log of every speaker
(which no credential of a component may: that is the point of them)."""

from __future__ import annotations

from pathlib import Path

from llmgw.bus import auth
from llmgw.bus.keystore import Keystore


def keystore(folder: Path) -> Keystore:
    return Keystore(folder).init()


def loader_creds(keys: Keystore) -> str:
    return str(keys.issue_unrestricted(keys.folder / "benchmark-loader.creds"))
