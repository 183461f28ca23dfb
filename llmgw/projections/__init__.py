"""The read models: the log projected into SQLite for the CLI and for people.

    migrate.py    the plain-SQL migrations under projections/, applied once each
    db.py         opening the database (WAL), reading and waiting for its position
    rows.py       what a batch of events changes, as rows (pure: the core's fold)
    mirror.py     what the database holds, in memory: only changed rows are written
    statements.py the SQL of one batch, as multi-row inserts
    projector.py  the shell: follow the log, write each batch in one transaction;
                  rebuild a fresh database from the whole log
    __main__.py   `python -m llmgw.projections --nats URL --db PATH`

The projector lives outside `llmgw.core` and reuses it: the rows are the
folded `State` (`fold.apply`), written down, never a second reading of the
events.
"""

from .db import position, wait_for_position
from .migrate import migrate, migrations
from .projector import Projector, ProjectorFailed, rebuild

__all__ = ["Projector", "ProjectorFailed", "migrate", "migrations", "position", "rebuild", "wait_for_position"]
