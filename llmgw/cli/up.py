"""`llmgw up`: the whole system on one machine, as one command.

It starts an embedded nats-server (unless given `--nats`), then each
component as a child process of its own, so that any of them can be killed
and restarted on its own, as in a real fleet. A child that dies is started
again after a pause, and so is NATS, on the same store (the components
reconnect by themselves). Ctrl-C (or SIGTERM) stops every process it started, the
components first, NATS last, and running it again resumes from the same log.

Unless told `--no-agent`, a real agent runs this machine as a node (named
after the host, with an agent file written for a CPU-only machine unless
`--agent-file` gives one; its state under `<state dir>/agent`). It stops its
engines when `up` stops, but an agent that dies is started again and adopts
them. Unless told `--no-demo`, an empty catalog gets the demo model
(SmolLM2-135M-Instruct on llama.cpp, on the CPU; `demo.py`), and `up` says
where it answers once it is ready.

Always with auth (llmgw/bus/auth.py): it makes the NATS operator and account
keys under `<state dir>/creds` the first time, and a credential per
component (control, projector, the agent of its node, its gateway) and one for
the tools (`creds/operator.creds`, which `llmgw ctl`, `replay` and
`projections rebuild` run here find by themselves); its NATS refuses
anonymous connections. With `--nats`, the components present those
credentials to that server. The control plane signs its commands with the
key store's command key (`creds/keys/commands.nk`) and the agent obeys only
those (`--command-key creds/commands.pub`; bus/signing.py), as do agents
started in another shell here, which find it as they find their credential.

Unless told `--no-console`, the web console (llmgw/console/) on
`--console-port` (loopback unless `--console-listen` says otherwise), with
the token in `<state dir>/console.token`: `up` prints its URL, token and all.

One `llmgw up` per state dir: it holds `<state dir>/up.lock` (flock, with
its pid in it) for its life; another on the same folder exits with 3 at once,
naming that pid. A port taken (NATS's, the gateway's) exits with 2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..bus import signing
from ..bus.auth import DEFAULTS as AUTH, CredentialError
from ..bus.keystore import Keystore
from ..bus.server import NatsServer, PortTaken, free_port, listening, port_is_taken
from ..ctl.locate import DB_FILE, remove_up_file, write_up_file

RESTART_PAUSE_S = 1.0  # doubled for each quick death in a row, up to a minute
HEALTHY_AFTER_S = 30.0
STOP_TIMEOUT_S = 20.0  # the agent stops its engines first
STOP_ORDER = ("console", "gateway", "control", "agent", "projector")  # by the first word of a child's name


class Child:
    def __init__(self, name: str, argv: list[str]) -> None:
        self.name, self.argv = name, argv
        self.proc: subprocess.Popen | None = None
        self.died_at = 0.0
        self.started_at = 0.0
        self.pause = RESTART_PAUSE_S

    def start(self) -> None:
        # A session of its own: a Ctrl-C in the terminal reaches `up` alone,
        # which then stops the children in order.
        self.proc = subprocess.Popen(self.argv, start_new_session=True, stdin=subprocess.DEVNULL)
        self.started_at = time.monotonic()
        print(f"  {self.name}: pid {self.proc.pid}", flush=True)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


LISTEN_WAIT_S = 30.0  # how long `up` waits for its gateway and console to listen before it says "ready"


def by_name(children: list[Child], name: str) -> Child | None:
    return next((c for c in children if c.name == name), None)


def await_listening(children: list[tuple[Child, str, int]]) -> None:
    """Wait until each child listens on its port, it exits, or LISTEN_WAIT_S
    passes (then say so: `up` goes on, its restarts may yet bring it up)."""
    deadline = time.monotonic() + LISTEN_WAIT_S
    for child, listen, port in children:
        host = "127.0.0.1" if listen in ("0.0.0.0", "::") else listen
        while not listening(port, host):
            if child.proc is None or child.proc.poll() is not None or time.monotonic() > deadline:
                print(f"llmgw up: the {child.name} is not listening on port {port} yet", flush=True)
                break
            time.sleep(0.05)


LOCK_FILE = "up.lock"  # in the state dir


class StateDirInUse(RuntimeError):
    pass


STATE_DIR_MODE = 0o700
CONSOLE_NAME = "local"  # the name of its console's credential, creds/console-local.creds


def private_state_dir(state: Path) -> None:
    """The state dir, made readable by its owner alone; one made more open
    (by an older llmgw, at 0755) is tightened, saying so. Why (issue 35,
    finding 9): it held at 0755 the read models and the control plane's
    snapshot, API-key hashes in both, readable by every local user; the key
    store below it is 0700 itself, but the rest was not."""
    import stat

    state.mkdir(mode=STATE_DIR_MODE, parents=True, exist_ok=True)
    mode = stat.S_IMODE(state.stat().st_mode)
    if mode != STATE_DIR_MODE:
        os.chmod(state, STATE_DIR_MODE)
        print(f"llmgw up: {state} was mode {mode:04o}, readable by others: now {STATE_DIR_MODE:04o} "
              f"(its read models and snapshot hold API-key hashes)", file=sys.stderr, flush=True)


def lock_state_dir(state: Path) -> int:
    """Hold the state dir for the life of this process: the open lock file.

    A second `llmgw up` on one folder once started a second NATS, projector
    and agent on the same files: the first then died on a raw
    sqlite3.IntegrityError and the second deleted up.json on its way out.
    flock, not a pid file alone: the kernel lets go when the holder dies,
    however it dies, so a lock file left by a dead `up` blocks nothing. The
    file is never deleted: one unlinked under a waiting opener would let two
    hold "the" lock at once.
    """
    import fcntl

    path = state / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        for _ in range(20):  # the holder writes its pid just after it takes the lock
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if holder:
                break
            time.sleep(0.05)
        os.close(fd)
        raise StateDirInUse(
            f"{state.resolve()} is in use by another llmgw up (pid {holder or 'unknown'}): "
            "stop it first, or give another --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def up(
    state_dir: str,
    nats_port: int,
    nats_url: str | None,
    *,
    agent: bool = True,
    demo: bool = True,
    agent_file: str | None = None,
    node_name: str | None = None,
    gateway_port: int | None = 8080,
    engine_ports=None,  # agentfile.PortRange for the local agent; None: its agent file's
    gateway_listen: str = "127.0.0.1",
    console_port: int | None = None,  # None: no console
    console_listen: str = "127.0.0.1",
    metrics_port: int = 0,  # the control plane's /metrics on 127.0.0.1; 0: a free one
    wait_timeout: float | None = None,  # the gateway's --wait-timeout; None: its default
) -> int:
    import asyncio

    from . import demo as demo_mod

    state = Path(state_dir)
    private_state_dir(state)
    try:
        # Before anything is started or written (up.json above all).
        lock_state_dir(state)  # its descriptor stays open: held until this process ends
    except StateDirInUse as e:
        print(f"llmgw up: {e}", file=sys.stderr)
        return 3
    demo = demo and agent
    if demo:
        # Before anything runs: a download interrupted leaves nothing to stop.
        problem = demo_mod.ensure_weights(state)
        if problem:
            print(f"llmgw up: no demo model ({problem}); run with --no-demo to stop trying", file=sys.stderr, flush=True)
            demo = False
    # With SO_REUSEADDR (port_is_taken), as the gateway listens: a rerun right
    # after Ctrl-C found the port "taken" by the last run's connections in
    # TIME_WAIT, though the gateway would have listened there fine.
    if gateway_port is not None and port_is_taken(gateway_port):
        print(f"llmgw up: the gateway's port {gateway_port} is taken: give another with --gateway-port", file=sys.stderr)
        return 2
    if console_port is not None and port_is_taken(console_port):
        # Unlike the gateway's: the console is a window on the fleet, not a
        # part of it, and a second `up` on one machine (a test's) must not
        # fail for the default port another one holds.
        print(f"llmgw up: the console's port {console_port} is taken: running without a console "
              f"(give another with --console-port)", file=sys.stderr, flush=True)
        console_port = None
    if metrics_port and port_is_taken(metrics_port):
        print(f"llmgw up: the metrics port {metrics_port} is taken: give another with --metrics-port", file=sys.stderr)
        return 2
    metrics_port = metrics_port or free_port()
    from .running import default_node_name

    node = node_name or default_node_name()
    gateway_name = f"{default_node_name()}-{gateway_port}"[:64]
    try:
        keys = Keystore(state / AUTH.creds_dir).init()
        creds = {role: str(keys.ensure(role)) for role in ("control", "projector", "operator")}
        # The console's own: it may publish only the actions it offers (bus/auth.py CONSOLE_ACTIONS).
        creds["console"] = str(keys.ensure("console", CONSOLE_NAME))
        if agent:
            creds["agent"] = str(keys.ensure("agent", node))
        if gateway_port is not None:
            creds["gateway"] = str(keys.ensure("gateway", gateway_name))
    except (CredentialError, OSError) as e:
        print(f"llmgw up: the credentials in {state / AUTH.creds_dir}: {e}", file=sys.stderr)
        return 2
    server = None
    if nats_url is None:
        server = NatsServer(state / "nats", nats_port, auth=keys)
        try:
            server.start()
        except (PortTaken, RuntimeError, TimeoutError) as e:
            print(f"llmgw up: {e}", file=sys.stderr)
            return 2
        nats_url = server.url
    embedded = f" (pid {server.proc.pid})" if server is not None and server.proc is not None else ""
    print(f"llmgw up: NATS (JetStream) at {nats_url}{embedded}, state in {state.resolve()}", flush=True)
    db = state / DB_FILE
    py = sys.executable
    children = [
        Child(
            "control plane",
            [py, "-m", "llmgw", "control", "--nats", nats_url, "--state-dir", str(state), "--creds", creds["control"],
             "--metrics-listen", f"127.0.0.1:{metrics_port}", "--signing-key", str(keys.keys_dir / signing.SEED_FILE)],
        ),
        # The read models: it waits for the streams the control plane creates.
        Child("projector", [py, "-m", "llmgw.projections", "--nats", nats_url, "--db", str(db), "--creds", creds["projector"]]),
    ]
    if agent:
        af = Path(agent_file) if agent_file else demo_mod.write_agent_file(state / "agent.yaml")
        children.append(
            Child(
                f"agent {node}",
                [
                    py, "-m", "llmgw", "agent", "--name", node, "--agent-file", str(af),
                    "--state-dir", str(state / "agent"), "--nats", nats_url, "--stop-engines-on-exit",
                    *(("--engine-ports", str(engine_ports)) if engine_ports else ()),
                    "--creds", creds["agent"], "--command-key", str(keys.folder / signing.PUBLIC_FILE),
                ],
            )  # fmt: skip
        )
    gateway_url = ""
    if gateway_port is not None:
        host = "127.0.0.1" if gateway_listen in ("0.0.0.0", "::") else f"[{gateway_listen}]" if ":" in gateway_listen else gateway_listen
        gateway_url = f"http://{host}:{gateway_port}"
        children.append(
            Child("gateway", [py, "-m", "llmgw", "gateway", "--nats", nats_url, "--port", str(gateway_port),
                              "--listen", gateway_listen, "--creds", creds["gateway"],
                              *(("--wait-timeout", repr(wait_timeout)) if wait_timeout is not None else ())])
        )  # fmt: skip
    console_url = ""
    if console_port is not None:
        from ..console.server import console_url as url_of, token_from

        token_file = state / "console.token"
        console_url = url_of(console_listen, console_port, token_from(str(token_file)))
        children.append(
            Child("console", [py, "-m", "llmgw", "console", "--nats", nats_url, "--db", str(db), "--port", str(console_port),
                              "--listen", console_listen, "--token-file", str(token_file), "--creds", creds["console"]])
        )  # fmt: skip
    stopping = False

    def on_signal(signum, frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    watcher = None
    try:
        for c in children:
            c.start()
        # How `llmgw ctl` (and the other commands) run in this folder find us.
        write_up_file(state, nats=nats_url, db=db)
        # Say "ready" only when the URLs printed below answer: a client (a test's
        # openai SDK) that asked the gateway at once was refused a connection.
        await_listening([(c, listen, port) for c, listen, port in (
            (by_name(children, "gateway"), gateway_listen, gateway_port),
            (by_name(children, "console"), console_listen, console_port),
        ) if c is not None])  # fmt: skip
        if demo:
            try:
                said = asyncio.run(demo_mod.apply_demo(nats_url, creds=creds["operator"]))
            except Exception as e:  # the control plane slow to make the streams, NATS gone
                said = f"could not apply the demo model: {e}"
            if said:
                print(f"llmgw up: {said}", flush=True)
            watcher = demo_mod.DemoWatcher(nats_url, gateway=gateway_url, creds=creds["operator"])
            watcher.start()
        print(
            f"read models (SQLite): {db.resolve()}\n"
            + (f"gateway (OpenAI API): {gateway_url}/v1\n" if gateway_url else "")
            + (f"console: {console_url}\n" if console_url else "")
            + f"control plane metrics (Prometheus): http://127.0.0.1:{metrics_port}/metrics\n"
            + f"credentials: {keys.folder.resolve()} (the tools': operator.creds)\n"
            + f"ready. In other shells, here (or with --nats {nats_url} --creds {Path(creds['operator']).resolve()}):\n"
            + ("  llmgw ctl get replicas --watch           # the demo model, starting\n" if demo else "")
            + "  llmgw agent --simulate --name gpu-1 --gpus 8\n"
            "  llmgw ctl apply -f deploy/catalog.example.yaml --wait\n"
            "  llmgw ctl get replicas --watch\n"
            "  llmgw replay\n"
            "Ctrl-C stops everything.",
            flush=True,
        )
        nats_died_at, nats_pause = 0.0, RESTART_PAUSE_S
        while not stopping:
            time.sleep(0.2)
            if server is not None and server.proc is not None and server.proc.poll() is not None and not stopping:
                # NATS is supervised like the other children: started again
                # on the same store; the components reconnect by themselves.
                if not nats_died_at:
                    nats_died_at = time.monotonic()
                    print(
                        f"llmgw up: NATS exited with {server.proc.returncode}; starting it again in {nats_pause:g}s "
                        f"with the same store ({server.store_dir.resolve()})",
                        flush=True,
                    )
                elif time.monotonic() - nats_died_at >= nats_pause:
                    try:
                        server.start()
                        print(f"llmgw up: NATS started again at {nats_url} (pid {server.proc.pid})", flush=True)
                        nats_died_at, nats_pause = 0.0, RESTART_PAUSE_S
                    except (PortTaken, RuntimeError, TimeoutError) as e:
                        nats_died_at, nats_pause = time.monotonic(), min(nats_pause * 2, 60.0)
                        print(f"llmgw up: NATS did not start again ({e}); trying again in {nats_pause:g}s", flush=True)
            for c in children:
                if c.proc is not None and c.proc.poll() is not None and not stopping:
                    if not c.died_at:
                        c.died_at = time.monotonic()
                        lived = c.died_at - c.started_at
                        c.pause = RESTART_PAUSE_S if lived > HEALTHY_AFTER_S else min(c.pause * 2, 60.0)
                        print(
                            f"llmgw up: {c.name} exited with {c.proc.returncode}; starting it again in {c.pause:g}s",
                            flush=True,
                        )
                    elif time.monotonic() - c.died_at >= c.pause:
                        c.died_at = 0.0
                        c.start()
    finally:
        print("llmgw up: stopping", flush=True)
        if watcher is not None:
            watcher.halt.set()
        remove_up_file(state)
        # The gateway first (no new requests), then the control plane, then
        # the agent, the projector last (it records all of it). The control
        # plane before the agent: running on, it read the agent's engines
        # stopping as replicas failing and placed their replacements on the
        # agent that was exiting, a placement that never ran.
        for c in sorted(children, key=lambda c: STOP_ORDER.index(c.name.split()[0])):
            c.stop()
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(up(os.environ.get("LLMGW_STATE_DIR", ".llmgw"), 4222, None))
