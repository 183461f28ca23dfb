"""The gateway's routing table kept up with the log: each event folded into
the gateway's State (core/folding/fold.py), and after a burst of them the table
rebuilt once (routing.build): a Backend per target, its connection pool kept
while the target stays the same (weights updated in place), pools of targets
gone closed and their replicas forgotten by the router at once (stopped,
draining, a new generation), each key's limits kept while its figures stay
the same. Requests waiting for a replica are woken by each rebuild.

A mixin of server.Gateway, which owns the attributes named below.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..core.folding.fold import apply
from .limits import KeyLimits
from .routing import Backend, build
from .upstream import Pool

if TYPE_CHECKING:
    from ..core.folding.state import State
    from .choose import Router
    from .config import GatewayConfig
    from .routing import Table


class TableUpkeep:
    """Folding the log into `state`, and `table`, `backends`, `by_model` and
    `limits` rebuilt from it."""

    bus: object
    config: GatewayConfig
    connect_timeout: float
    state: State
    table: Table
    backends: dict[tuple[str, str, str, str], Backend]
    by_model: dict[str, list[Backend]]
    limits: dict[str, KeyLimits]
    router: Router
    waiters: list[asyncio.Future]
    _dirty: bool

    def on_message(self, seq: int, subject: str, data: bytes) -> None:
        apply(self.state, seq, subject, data)
        if not subject.startswith("llmgw.gw.") and not self._dirty:
            self._dirty = True
            asyncio.get_running_loop().call_soon(self.rebuild)

    def rebuild(self) -> None:
        """The routing table again, from the state as folded so far."""
        self._dirty = False
        table = build(self.state)
        backends: dict[tuple[str, str, str, str], Backend] = {}
        by_model: dict[str, list[Backend]] = {}
        for route in table.routes.values():
            found = []
            for t in route.targets:
                key = (t.replica, t.endpoint, t.identity, t.key_name)
                b = self.backends.get(key)
                if b is None:
                    b = Backend(t)
                    b.pool = Pool(
                        b.host, b.port, self.connect_timeout, t.identity, keys=self.bus, key_name=t.key_name,
                        key_timeout=self.config.key_timeout,
                    )
                else:
                    b.weight = t.weight
                backends[key] = b
                found.append(b)
            if found:
                by_model[route.name] = found
        gone = [b for key, b in self.backends.items() if key not in backends]
        for b in gone:
            b.pool.close()
        self.router.forget(b.token for b in gone)  # stopped, draining, a new generation: at once
        now = time.monotonic()
        limits = {}
        for _, (name, key) in table.keys.items():
            lim = self.limits.get(name)
            if lim is None or not lim.same(key.requests_per_minute, key.tokens_per_minute):
                lim = KeyLimits(key.requests_per_minute, key.tokens_per_minute, now)
            limits[name] = lim
        self.table, self.backends, self.by_model, self.limits = table, backends, by_model, limits
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
