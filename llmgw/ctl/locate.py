"""Where the fleet is: the NATS URL and the read-model database a command uses.

`llmgw up` writes `<state dir>/up.json` (its pid, NATS URL and database) when
it starts and removes it when it stops. With nothing given, `llmgw ctl` looks
for that file in `$LLMGW_STATE_DIR`, else in `.llmgw` of the working
directory or of the nearest parent that has one (as git finds its
repository), so the shell where `llmgw up` was started, or any folder below,
just works. Flags win over the environment, which wins over the file.

The credential is found the same way: `--creds FILE`, else `$LLMGW_CREDS`,
else the tools' credential of that state dir, `creds/operator.creds`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

UP_FILE = "up.json"
DEFAULT_STATE_DIR = ".llmgw"
DEFAULT_NATS = "nats://127.0.0.1:4222"
DB_FILE = "readmodels.db"  # in the state dir


@dataclass(frozen=True)
class Where:
    nats: str
    db: Path | None  # None: no read models known
    found: str  # how they were found, for error messages
    creds: Path | None = None  # the NATS .creds to connect with (None: anonymous)
    nats_from: str = "the default"  # where the NATS URL came from: "--nats", "$LLMGW_NATS", an up file, "the default"

    @property
    def nats_given(self) -> bool:
        return self.nats_from in ("--nats", "$LLMGW_NATS")

    @property
    def how_nats(self) -> str:
        """Where the URL came from, and what to do about it, for an error message."""
        if self.nats_given:
            return f"the URL given by {self.nats_from}"
        if self.nats_from == "the default":
            return f"{DEFAULT_NATS}, the default: no running llmgw up found here; run llmgw up, or give --nats URL"
        return f"found from {self.nats_from}; is llmgw up running? or give --nats URL"


def write_up_file(state_dir: Path, *, nats: str, db: Path) -> Path:
    path = state_dir / UP_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "nats": nats, "db": str(db.resolve())}) + "\n")
    os.replace(tmp, path)
    return path


def remove_up_file(state_dir: Path) -> None:
    (state_dir / UP_FILE).unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_state_dir(start: Path | None = None) -> Path | None:
    env = os.environ.get("LLMGW_STATE_DIR")
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_STATE_DIR).is_dir():
            return folder / DEFAULT_STATE_DIR
    return None


def locate(nats: str | None = None, db: str | None = None, creds: str | None = None) -> Where:
    """The NATS URL, database and credential to use, from flags, environment or the local `llmgw up`."""
    from ..bus.keystore import find_creds

    nats_from = "--nats" if nats else "$LLMGW_NATS" if os.environ.get("LLMGW_NATS") else ""
    nats = nats or os.environ.get("LLMGW_NATS")
    db = db or os.environ.get("LLMGW_DB")
    found = "flags and environment"
    state_dir = find_state_dir() if nats is None or db is None else None
    if state_dir is not None:
        try:
            up = json.loads((state_dir / UP_FILE).read_text())
        except (OSError, ValueError):
            up = {}
        if up and _pid_alive(int(up.get("pid", 0))):
            if nats is None and up.get("nats"):
                nats, nats_from = up["nats"], f"the llmgw up of {state_dir} (pid {up['pid']})"
            db = db or up.get("db")
            found = f"the llmgw up of {state_dir} (pid {up['pid']})"
        elif db is None and (state_dir / DB_FILE).exists():
            # up is not running, but its read models are still there to read.
            db = str(state_dir / DB_FILE)
            found = f"{state_dir} (llmgw up is not running there)"
    if not creds and not os.environ.get("LLMGW_CREDS") and state_dir is None:
        state_dir = find_state_dir()
    return Where(
        nats=nats or DEFAULT_NATS, db=Path(db) if db else None, found=found, nats_from=nats_from or "the default",
        creds=find_creds(creds, state_dir=state_dir),
    )  # fmt: skip
