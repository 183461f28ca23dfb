"""Issue 35, finding 9, each tried as the attacker did and seen contained:

- terminal escape codes in a node's labels reached the operator's terminal
  raw, in `ctl get nodes` and `describe node`;
- the state dir was mode 0755: its read models and snapshot (API-key hashes)
  readable by every local user;
- the console acted with the operator's credential: it could say anything an
  operator may (the catalog, API keys, policy).

Over real processes: `llmgw up` (nats-server with JWT auth, control plane,
projector), a simulated agent registering the label, `llmgw ctl` reading it;
the console's credential against a real nats-server with auth."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from llmgw.bus import STREAM, auth, credentials, keystore, read_log
from llmgw.bus.nats import NatsBus
from llmgw.bus.server import free_port
from llmgw.core.contract import events as ev
from llmgw.ctl.printable import printable, printable_lines

from .test_auth import Speaker
from .test_ctl_e2e import Up, ctl

pytestmark = pytest.mark.nats

# Clear the screen, home the cursor, set the window title, and a one-byte CSI (C1) with DEL: a node's own words.
EVIL = "\x1b[2J\x1b[H\x1b]0;owned\x07r4\x9b31m\x7f"
SHOWN = "\\x1b[2J\\x1b[H\\x1b]0;owned\\x07r4\\x9b31m\\x7f"
# What a node's label can still carry past the contract's bounds (they refuse C0 and DEL
# in labels, core/contract/bounds.py): one-byte CSIs (C1) and a right-to-left override.
LABEL_EVIL = "\x9b2J\x9bHr4\x9b31m\u202eowned"


def test_control_characters_are_shown_as_escapes_for_people():
    assert printable(EVIL) == SHOWN
    assert printable("a\nb\tc\rd\u202eevil\u2066") == "a\\nb\\tc\\rd\\u202eevil\\u2066"  # a forged row; Trojan Source
    assert printable("gpu-1 rack=r4 ünïcode ok") == "gpu-1 rack=r4 ünïcode ok"
    assert printable_lines("line one\nline \x1b[31mtwo") == "line one\nline \\x1b[31mtwo"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _until(predicate, timeout: float, why: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


def test_a_nodes_escape_codes_are_shown_escaped_and_the_state_dir_is_its_owners(tmp_path, processes):
    state = tmp_path / ".llmgw"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)  # as an older llmgw left it
    console_port = free_port()
    up = Up(tmp_path, "--console-port", str(console_port))
    try:
        assert _mode(state) == 0o700
        assert "was mode 0755, readable by others: now 0700" in up.text()
        processes.start("evil", "agent", "--simulate", "--name", "evil-1", "--gpus", "2", "--nats", up.url,
                        "--label", f"team={LABEL_EVIL}", env=up.env)  # fmt: skip

        def registered() -> bool:
            out = ctl(up, "get", "nodes", "-o", "json")
            return out.returncode == 0 and any(n["name"] == "evil-1" for n in json.loads(out.stdout))

        _until(registered, 30, "the simulated node did not register")
        for args in (("get", "nodes"), ("get", "nodes", "-o", "wide"), ("describe", "node", "evil-1")):
            out = ctl(up, *args)
            assert out.returncode == 0, out.stderr
            printed = out.stdout + out.stderr
            assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", printed), (args, printed)
            if args[0] == "describe" or "wide" in args:  # (a fitted table may cut a long label short)
                assert f"team={printable(LABEL_EVIL)}" in out.stdout, (args, out.stdout)
            else:
                assert "team=\\x9b2J" in out.stdout, (args, out.stdout)
        # For tools, exact: JSON escapes control characters itself, and reads back as the node said it.
        out = ctl(up, "describe", "node", "evil-1", "-o", "json")
        assert json.loads(out.stdout)["node"]["labels"]["team"] == LABEL_EVIL
        # Files of secrets in it: the read models (API-key hashes) are the owner's alone too.
        assert _mode(up.db) == 0o600
        # And its console has a credential of its own (tested below), issued by up, with which it acts.
        who = credentials.identity(state / "creds" / "console-local.creds")
        assert (who.role, who.name) == ("console", "local")
        assert f"console: http://127.0.0.1:{console_port}/" in up.text()
        token = (state / "console.token").read_text().strip()
        host = f"127.0.0.1:{console_port}"
        request = urllib.request.Request(
            f"http://{host}/api/action/hold", data=json.dumps({"domain": "rack/r9", "reason": "test"}).encode(),
            headers={"Authorization": f"Bearer {token}", "Origin": f"http://{host}", "X-LLMGW-Console": "1",
                     "Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as answer:
            acted = json.loads(answer.read())
        assert acted["event"] == "domain.held" and acted["seq"] >= 1
    finally:
        up.stop()


def test_the_consoles_credential_is_issued_by_creds_issue(tmp_path):
    keys = keystore.Keystore(tmp_path / "creds").init()
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "creds", "issue", "console", "web-1", "--dir", str(keys.folder)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    issued = [(i.role, i.name) for i in keys.issued()]
    assert ("console", "web-1") in issued


def test_console_actions_are_the_subjects_of_what_the_console_publishes():
    """What the console's `act` makes (every `ev.X(` in it) is what its credential may publish: no more, no less."""
    source = (Path(auth.__file__).parent.parent / "console" / "server.py").read_text()
    act = source[source.index("async def act("):source.index("\nasync def serve(")]
    made = {getattr(ev, name) for name in re.findall(r"\bev\.([A-Z]\w+)\(", act)}
    assert made and all(ev.ORIGIN[cls] == "ctl" for cls in made)
    assert {f"llmgw.ctl.{ev.tag_of(cls)}" for cls in made} == set(auth.CONSOLE_ACTIONS)


async def test_the_consoles_credential_publishes_its_actions_and_nothing_else(auth_nats):
    control = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("control"))
    await control.ensure_streams()
    console = await NatsBus.connect(auth_nats.url, creds=auth_nats.creds("console", "web-1"))
    raw = await Speaker.connect(auth_nats, "console", "web-1")
    try:
        # What it offers: a label change lands in the log.
        labeled = ev.NodeLabeled(at=1.0, node="gpu-1", set={"llmgw.io/rack": "r1"}, remove=[])
        seq = await console.publish(ev.subject_for(labeled), ev.encode(labeled), msg_id="console-test-1")
        assert seq >= 1
        # What an operator may say and the console does not offer: refused by the server.
        spec = ev.ModelSpec(name="evil", profiles=[ev.ProfileSpec(name="p", gpus=1)])
        forged = [
            ev.ModelApplied(at=1.0, model=spec),
            ev.ApiKeyApplied(at=1.0, name="k", owner="o", key_sha256="0" * 64),
            ev.ModelRemoved(at=1.0, name="chat"),
        ]
        for event in forged:
            subject = ev.subject_for(event)
            await raw.nc.publish(subject, ev.encode(event))
            assert await raw.refused("publish", subject), (subject, raw.errors)
        # Nor asks an agent for logs, nor the control plane's subjects, nor commands.
        for subject in ("llmgw.agent-logs.gpu-1", "llmgw.control.decided", "llmgw.cmd.gpu-1"):
            await raw.nc.publish(subject, b"{}")
            assert await raw.refused("publish", subject), (subject, raw.errors)
        # And the bus says so before trying (roles.may_publish: the server's rule).
        with pytest.raises(PermissionError, match="console web-1 .* may not publish on llmgw.ctl.model.applied"):
            await console.publish("llmgw.ctl.model.applied", ev.encode(forged[0]), msg_id="console-test-2")
        subjects = [s for _, s, _ in await read_log(control)]
        assert subjects == ["llmgw.ctl.node.labeled"]
        assert (await control.js.stream_info(STREAM)).state.messages == 1
    finally:
        await raw.close()
        await console.close()
        await control.close()
