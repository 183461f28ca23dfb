"""The gateway's routing table kept up with the log: each event folded into
the gateway's State (core/folding/fold.py), and after a burst of them the table
rebuilt once (routing.build): a Backend per target, its connection pool kept
while the target stays the same (weights updated in place), pools of targets
gone closed and their replicas forgotten by the router at once (stopped,
draining, a new generation), the keys' and owners' shared limits told the
catalog's figures (shared_limits.py). Requests waiting for a replica are woken by each rebuild.

A mixin of server.Gateway, which owns the attributes named below.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..core.folding.fold import apply
from .routing import Backend, build
from .upstream import Pool

if TYPE_CHECKING:
    from ..core.folding.state import State
    from .choose import Router
    from .config import GatewayConfig
    from .routing import Table
    from .shared_limits import SharedLimits


class TableUpkeep:
    """Folding the log into `state`, and `table`, `backends`, `by_model` and
    the shared limits rebuilt from it."""

    bus: object
    config: GatewayConfig
    connect_timeout: float
    state: State
    table: Table
    backends: dict[tuple[str, str, str, str], Backend]
    by_model: dict[str, list[Backend]]
    quotas: SharedLimits
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
        self.quotas.update(self.state.api_keys, self.state.owners)
        self.table, self.backends, self.by_model = table, backends, by_model
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
