"""Commands only from the leader (issue 35, finding 1): signed by the control
plane for one node, in its term, and refused otherwise by every agent.

The attack as found: a credential that reads the log (gateway, operator,
projector) publishes a command-shaped message on a subject it may publish,
then makes a JetStream push consumer on the log deliver it to
`llmgw.cmd.<node>` (nats-server does not check a push consumer's delivery
subject). A forged stop stopped replicas, a forged start ran an engine, a
forged re-register of term 10**9 fenced the real agent off for good.

Unit tests of the key, the envelope and the term rules first; then the
attack over real processes: a real nats-server with JWT auth, the control
plane, a simulated and a real agent as processes of their own, each with its
own credential, and the attacker as each reader credential.
"""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import time
from pathlib import Path

import nats
import nkeys
import pytest

from llmgw.agent.inventory import Inventory
from llmgw.agent.node import NodeAgent
from llmgw.agent.protocol import MAX_TERM_JUMP, REFUSAL_LOG_BURST, Gate, term_refusal
from llmgw.agent.simulated import SimulatedAgent
from llmgw.agent.statefile import AgentState
from llmgw.bus import COMMAND_PREFIX, STREAM, credentials, keystore, roles, signing
from llmgw.bus.memory import MemoryBus
from llmgw.control.plane import ControlPlane
from llmgw.core.folding import commands as cmds
from llmgw.core.contract import events as ev

from .conftest import engine_ports, engine_starts, kill_engines, run_llmgw
from .scenario import model, publish, until

FAKE = Path(__file__).resolve().parent / "fake_engine.py"


def _keys(tmp_path: Path, name: str = "creds") -> tuple[signing.Signer, signing.Verifier]:
    keys = keystore.Keystore(tmp_path / name).init()
    signer = signing.Signer.from_file(keys.keys_dir / signing.SEED_FILE)
    return signer, signing.Verifier.load(str(keys.folder / signing.PUBLIC_FILE))


def _stop(term: int = 1, log: str = "L", shard: str = "m-1.0") -> cmds.StopShard:
    return cmds.StopShard(shard=shard, generation=1, reason="r", term=term, log=log)


# --------------------------------------------------------------------------- the key and the envelope


def test_the_key_store_makes_a_private_signing_key_and_publishes_its_public_key(tmp_path):
    keys = keystore.Keystore(tmp_path / "creds").init()
    seed = keys.keys_dir / signing.SEED_FILE
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    pub = (keys.folder / signing.PUBLIC_FILE).read_text().strip()
    assert pub.startswith("N") and pub == signing.Signer.from_file(seed).public_key
    before = seed.read_bytes()
    keystore.Keystore(tmp_path / "creds").init()  # again: the same key (agents keep theirs)
    assert seed.read_bytes() == before and (keys.folder / signing.PUBLIC_FILE).read_text().strip() == pub
    out = run_llmgw("creds", "command-key", "--dir", str(keys.folder))
    assert out.returncode == 0 and out.stdout.strip() == pub, out.stderr


def test_a_signed_command_opens_only_for_its_node_with_its_key_and_unaltered(tmp_path):
    signer, verifier = _keys(tmp_path)
    _, other_key = _keys(tmp_path, "other")
    data = cmds.encode(_stop(term=3))
    sealed = signer.seal("n1", data)
    assert verifier.open("n1", sealed) == data
    assert cmds.decode(verifier.open("n1", sealed)) == _stop(term=3)
    refusals = {
        "another node": (verifier, "n2", sealed),
        "another key": (other_key, "n1", sealed),
        "altered": (verifier, "n1", sealed.replace(b'"term":3', b'"term":9')),
        "unsigned": (verifier, "n1", data),
        "bad envelope": (verifier, "n1", b'{"sig":"!!","cmd":'),
        "empty": (verifier, "n1", b""),
    }
    kinds = {}
    for what, (v, node, payload) in refusals.items():
        with pytest.raises(signing.Refused) as e:
            v.open(node, payload)
        kinds[what] = e.value.kind
    assert kinds == {
        "another node": "bad signature", "another key": "bad signature", "altered": "bad signature",
        "unsigned": "unsigned", "bad envelope": "malformed", "empty": "unsigned",
    }  # fmt: skip
    # A key given as itself or as its file; a wrong one says so.
    assert signing.Verifier.load(verifier.public_key).public_key == verifier.public_key
    with pytest.raises(signing.CommandKeyError, match="not a command key"):
        signing.Verifier(keystore.Keystore(tmp_path / "creds").account_public_key())
    with pytest.raises(signing.CommandKeyError):
        signing.Verifier.load(str(tmp_path / "missing.pub"))


def test_the_term_rules():
    assert term_refusal(5, "L", 5, "L", MAX_TERM_JUMP) == ""
    assert "has spoken" in term_refusal(4, "L", 5, "L", MAX_TERM_JUMP)
    assert term_refusal(5 + MAX_TERM_JUMP, "L", 5, "L", MAX_TERM_JUMP) == ""
    assert "max_term_jump" in term_refusal(6 + MAX_TERM_JUMP, "L", 5, "L", MAX_TERM_JUMP)
    assert term_refusal(10**9, "L", 5, "L", 0) == ""  # 0: no bound
    # Another log (NATS made anew) counts afresh; a fresh agent has seen none.
    assert term_refusal(1, "M", 5, "L", MAX_TERM_JUMP) == ""
    assert term_refusal(7000, "L", 0, "", MAX_TERM_JUMP) == ""


def test_the_gate_admits_only_signed_commands_in_a_term_it_may_act_in(tmp_path):
    signer, verifier = _keys(tmp_path)
    gate, kept = Gate("n1", verifier, max_term_jump=10), AgentState(term=3, log="L")
    assert gate.admit(signer.seal("n1", cmds.encode(_stop(term=4))), kept) == _stop(term=4)
    assert (kept.term, kept.log) == (4, "L")
    refused = [
        cmds.encode(_stop(term=5)),  # unsigned
        signer.seal("n2", cmds.encode(_stop(term=5))),  # for another node
        signer.seal("n1", cmds.encode(cmds.Reregister(reason="x", term=10**9, log="L"))),  # far past: even signed
        signer.seal("n1", cmds.encode(_stop(term=3))),  # a deposed leader's
        signer.seal("n1", b'{"command":"launch"}'),  # signed, but no command
    ]
    for data in refused:
        assert gate.admit(data, kept) is None
    assert (kept.term, kept.log) == (4, "L")  # a refused command changes no term
    assert gate.refused == {"unsigned": 1, "bad signature": 1, "far term": 1, "stale term": 1, "malformed": 1}
    # Within the bound it moves on.
    assert gate.admit(signer.seal("n1", cmds.encode(_stop(term=14))), kept) is not None and kept.term == 14
    # No key configured: unsigned and signed alike (a dev NATS without auth).
    open_gate, kept = Gate("n1", None), AgentState()
    assert open_gate.admit(cmds.encode(_stop(term=1)), kept) == _stop(term=1)
    assert open_gate.admit(signer.seal("n1", cmds.encode(_stop(term=2))), kept) == _stop(term=2)


def test_a_flood_of_forgeries_is_counted_not_all_logged(tmp_path, caplog):
    _, verifier = _keys(tmp_path)
    gate, kept = Gate("n1", verifier), AgentState()
    with caplog.at_level("WARNING", logger="llmgw.agent"):
        for _ in range(1000):
            gate.admit(cmds.encode(_stop()), kept)
    assert gate.refused == {"unsigned": 1000}
    assert len(caplog.records) == REFUSAL_LOG_BURST


async def test_a_forged_far_term_never_reaches_the_real_agents_state_file(tmp_path):
    """The finding, on the real agent's own code: a re-register of term 10**9
    (here even signed, as from a leader gone wrong) is refused, the state
    file keeps the genuine term, and genuine commands are still obeyed."""
    signer, verifier = _keys(tmp_path)
    inventory = Inventory(gpus=[], cpu_cores=1, memory_gb=1)
    agent = NodeAgent(MemoryBus(), "n1", state_dir=tmp_path / "agent", inventory=inventory, command_key=verifier)
    agent.adopt()
    agent._on_command(signer.seal("n1", cmds.encode(_stop(term=2, shard="m-1.0"))))
    assert agent.state.term == 2
    agent._on_command(cmds.encode(cmds.Reregister(reason="forged", term=10**9, log="L")))  # unsigned
    agent._on_command(signer.seal("n1", cmds.encode(cmds.Reregister(reason="far", term=10**9, log="L"))))
    saved = json.loads((tmp_path / "agent" / "agent.json").read_text())
    assert saved["term"] == 2 and agent.gate.refused == {"unsigned": 1, "far term": 1}
    agent._on_command(signer.seal("n1", cmds.encode(_stop(term=3, shard="m-2.0"))))
    assert agent.protocol.memory.acted(("m-2.0", 1, "stop")) and json.loads((tmp_path / "agent" / "agent.json").read_text())["term"] == 3
    await asyncio.gather(*agent._tasks)


async def test_the_control_plane_signs_only_in_a_term_the_log_elected_it_and_agents_obey():
    """Over the in-memory bus: a plane that has not folded its own election
    signs nothing; once leading, its signed commands place a model on an
    agent that checks them."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        signer, verifier = _keys(Path(tmp))
    bus, stop = MemoryBus(), asyncio.Event()
    plane = ControlPlane(bus, tick=0.05, signer=signer)
    assert plane._command_for("n1", _stop()) is None  # not elected: nothing to sign with
    # Even holding the lease and believing itself in term 5: the log has not elected it.
    plane._lease_rev, plane._lease_until, plane.term = 1, time.monotonic() + 60, 5
    assert plane._command_for("n1", _stop()) is None
    plane._lease_rev, plane._lease_until, plane.term = 0, 0.0, 0
    agent = SimulatedAgent(bus, "n1", 4, loading_after=0.01, ready_after=0.01, heartbeat=0.1, command_key=verifier)
    tasks = [asyncio.create_task(x.run(stop)) for x in (plane, agent)]
    try:
        await publish(bus, ev.ModelApplied(at=1.0, model=model("m", min_replicas=2)))
        await until(lambda: [r.state for r in plane.state.replicas.values()] == ["ready"] * 2)
        assert plane.state.term == plane.term >= 1 and plane.state.leader == plane.leader
        sent = bus._commands["n1"]
        assert sent and all(c.startswith(b'{"sig":') for c in sent)
        assert not agent.gate.refused
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def test_the_key_is_given_by_flag_agent_file_or_the_local_key_store_and_a_bad_one_stops_the_start(tmp_path, monkeypatch):
    from llmgw.agent import agentfile

    keys = keystore.Keystore(tmp_path / "state" / "creds").init()
    pub = (keys.folder / signing.PUBLIC_FILE).read_text().strip()
    (tmp_path / "commands.pub").write_text(pub + "\n")
    (tmp_path / "agent.yaml").write_text("command_key: ./commands.pub\nmax_term_jump: 50\n")
    loaded = agentfile.load(tmp_path / "agent.yaml")
    assert loaded.command_key == str(tmp_path / "commands.pub") and loaded.max_term_jump == 50
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    assert signing.find_verifier(None, loaded.command_key, state_dir=None).public_key == pub
    assert signing.find_verifier(None, state_dir=tmp_path / "state").public_key == pub  # a local `llmgw up`'s
    assert signing.find_verifier(None, state_dir=tmp_path) is None  # none: unsigned, said loudly
    assert signing.find_signer(None, state_dir=tmp_path / "state").public_key == pub
    for argv, says in (
        (("agent", "--simulate", "--name", "x", "--command-key", str(tmp_path / "nope.pub")), "the command key"),
        (("agent", "--simulate", "--name", "x", "--command-key", str(tmp_path / "agent.yaml")), "not base32"),
        (("control", "--signing-key", str(tmp_path / "commands.pub")), "is not an nkey seed"),
    ):
        out = run_llmgw(*argv, "--nats", "nats://127.0.0.1:1", cwd=tmp_path)
        assert out.returncode == 2 and says in out.stderr, (argv, out.stderr)


def test_every_node_of_a_simulated_fleet_checks_the_key(tmp_path):
    from llmgw.agent.fleet import Fleet, NodeShape

    signer, verifier = _keys(tmp_path)
    fleet = Fleet([MemoryBus()], [NodeShape(name=f"s{i}", gpus=1) for i in range(3)], command_key=verifier)
    for name, agent in fleet.agents.items():
        assert agent.gate.key is verifier
        assert agent.gate.admit(cmds.encode(_stop()), agent.protocol.memory) is None  # unsigned
        assert agent.gate.admit(signer.seal(name, cmds.encode(_stop())), agent.protocol.memory) == _stop()


# --------------------------------------------------------------------------- over real processes


def _until(predicate, timeout: float, why) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, why()
        time.sleep(0.3)


def _fold(server):
    from .test_auth import _fold as fold

    return fold(server)


async def _connect(server, role: str, name: str | None = None):
    creds = server.creds(role, name)
    who = credentials.identity(creds)
    errors: list[str] = []

    async def on_error(e) -> None:
        errors.append(str(e))

    nc = await nats.connect(server.url, user_credentials=creds, inbox_prefix=who.inbox_prefix, error_cb=on_error,
                            allow_reconnect=False)  # fmt: skip
    return nc, errors


async def _push_to(nc, node: str, subject: str) -> str:
    """As the finding: a push consumer on the log delivering the messages of `subject` to node's command subject.
    "" when the server made it, else what it answered."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    try:
        await nc.jetstream().add_consumer(
            STREAM, ConsumerConfig(deliver_subject=f"{COMMAND_PREFIX}.{node}", filter_subject=subject,
                                   deliver_policy=DeliverPolicy.ALL),
        )  # fmt: skip
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def _forgeries(node: str, log_id: str, shard: str, generation: int, port: int) -> dict[str, bytes]:
    """Every command-shaped thing an attacker can make without the key."""
    start = cmds.StartShard(
        shard="evil-1.0", replica="evil-1", generation=1, model="evil", fingerprint="f", rank=0, gpus=[], port=port,
        nodes=[node], profile=ev.ProfileSpec(name="p", engine="fake", gpus=0), term=1, log=log_id,
    )  # fmt: skip
    stop = cmds.StopShard(shard=shard, generation=generation, reason="forged", term=1, log=log_id)
    fence = cmds.Reregister(reason="forged", term=10**9, log=log_id)
    attacker = signing.Signer(nkeys.encode_seed(b"\x01" * 32, nkeys.PREFIX_BYTE_SERVER))  # a key of its own
    return {
        "stop": cmds.encode(stop),
        "start": cmds.encode(start),
        "reregister of term 10**9": cmds.encode(fence),
        "stop signed with another key": attacker.seal(node, cmds.encode(stop)),
    }


# The nodes' own pools steer placement here (`admission: open`, core/rules/admission.py): this test is
# about commands, and each model must land on the agent it is meant for.
CATALOG = """\
policy:
  admission: open
models:
  - name: sim-m
    profiles: [{{name: p, gpus: 1, pool: sim}}]
  - name: real-m
    profiles: [{{name: cpu, engine: fake, gpus: 0, cpu_cores: 1, pool: real}}]
{more}"""
MORE = """\
  - name: real-n
    profiles: [{name: cpu, engine: fake, gpus: 0, cpu_cores: 1, pool: real}]
"""


@pytest.mark.timeout(180)
def test_forged_commands_from_every_reader_are_refused_by_real_agents(auth_nats, processes, tmp_path):
    keys = auth_nats.auth
    url = auth_nats.url
    seed, pub = keys.keys_dir / signing.SEED_FILE, keys.folder / signing.PUBLIC_FILE
    processes.start("control", "control", "--nats", url, "--creds", auth_nats.creds("control"), "--state-dir",
                    str(tmp_path / "control"), "--signing-key", str(seed))  # fmt: skip
    processes.start("sim", "agent", "--simulate", "--name", "sim", "--gpus", "1", "--label", "llmgw.io/pool=sim",
                    "--nats", url, "--creds", auth_nats.creds("agent", "sim"), "--command-key", str(pub))  # fmt: skip
    agent_file = tmp_path / "real.yaml"
    agent_file.write_text(
        f"labels: {{llmgw.io/pool: real}}\ncpu_cores: 2\nengine_ports: {engine_ports()}\ncommand_key: {pub}\n"
        f"templates: {{fake: '{sys.executable} {FAKE} --port {{port}}'}}\nstart_timeout_s: 30\nstop_timeout_s: 5\n"
    )
    state_dir = tmp_path / "real-state"
    processes.start("real", "agent", "--name", "real", "--agent-file", str(agent_file), "--state-dir", str(state_dir),
                    "--stop-engines-on-exit", "--nats", url, "--creds", auth_nats.creds("agent", "real"))  # fmt: skip
    try:
        _attack(auth_nats, processes, tmp_path, state_dir)
    finally:
        processes.stop_all()
        kill_engines(state_dir)


def _attack(auth_nats, processes, tmp_path: Path, state_dir: Path) -> None:
    url = auth_nats.url
    tools = ("--nats", url, "--creds", auth_nats.creds("operator"))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG.format(more=""))
    out = run_llmgw("ctl", *tools, "apply", "-f", str(catalog), cwd=tmp_path)
    assert out.returncode == 0, out.stderr

    def ready() -> dict[str, str]:
        st = _fold(auth_nats)
        return {r.model: r.shards[0].node for r in st.replicas.values() if r.state == "ready"}

    logs = lambda: "\n".join(processes.log(n)[-3000:] for n in ("control", "sim", "real"))  # noqa: E731
    _until(lambda: ready() == {"sim-m": "sim", "real-m": "real"}, 60, logs)
    assert "acting only on commands signed with the control plane's key" in processes.log("real")
    state = _fold(auth_nats)
    genuine = {r.model: r for r in state.replicas.values()}
    term = json.loads((state_dir / "agent.json").read_text())["term"]
    assert term == state.term >= 1
    starts = engine_starts(state_dir)
    log_id = asyncio.run(_log_id(auth_nats))

    delivered = asyncio.run(_forge_through_consumers(auth_nats, genuine, log_id))
    # Whatever reaches an agent, by any path (here published straight onto
    # its subject with the control plane's NATS credential, not its key).
    direct = asyncio.run(_forge_directly(auth_nats, genuine, log_id))
    time.sleep(2.0)  # time for an agent to act, had it obeyed
    st = _fold(auth_nats)
    assert {r.id for r in st.replicas.values() if r.state == "ready"} == {r.id for r in genuine.values()}, \
        "a forged stop stopped a replica"
    assert len(st.replicas) == 2 and "evil-1" not in st.replicas
    stories = [s for r in st.replicas.values() for s in r.shards if s.state != "ready"]
    assert not stories, stories
    assert engine_starts(state_dir) == starts, "a forged start ran an engine"
    assert json.loads((state_dir / "agent.json").read_text())["term"] == term, "a forged term reached the state file"
    for node in ("sim", "real"):
        # Each refused, with why: every forgery that reached it, by a consumer or straight.
        said = processes.log(node)
        unsigned = direct[node]["unsigned"] + delivered[node] * 3 // 4  # 3 of each 4 forgeries are unsigned
        assert unsigned <= REFUSAL_LOG_BURST  # (all logged: more of one reason in a window are only counted)
        assert said.count("ignoring a command: it is not signed") == unsigned, said[-3000:]
        assert said.count("ignoring a command") == direct[node]["all"] + delivered[node], said[-3000:]
        assert "ignoring a command: its signature is not the control plane's for this node" in said
    # Genuine commands are still obeyed: another model, placed and ready on the real agent.
    catalog.write_text(CATALOG.format(more=MORE))
    out = run_llmgw("ctl", *tools, "apply", "-f", str(catalog), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    _until(lambda: ready().get("real-n") == "real", 60, logs)
    assert engine_starts(state_dir) == starts + 1


async def _log_id(server) -> str:
    from llmgw.bus.nats import NatsBus

    bus = await NatsBus.connect(server.url, creds=server.creds("operator"))
    try:
        return await bus.log_id()
    finally:
        await bus.close()


async def _forge_through_consumers(server, genuine, log_id: str) -> dict[str, int]:
    """Each reader credential tries the finding's trick on each node; how many
    forgeries reached each node's subject. Counted by a fleet credential,
    which hears every node's commands where agents hear them (the server may
    refuse the consumer, or deliver where no agent listens: that is another
    part of issue 35's; the signature must hold either way)."""
    observer, _ = await _connect(server, "fleet", "observer")
    verifier = signing.Verifier.load(str(server.auth.folder / signing.PUBLIC_FILE))
    seen = {"sim": 0, "real": 0}

    def counter(node):
        async def cb(msg) -> None:
            try:
                verifier.open(node, msg.data)  # the control plane's own: not a forgery
            except signing.Refused:
                seen[node] += 1

        return cb

    for node in seen:
        await observer.subscribe(f"{COMMAND_PREFIX}.{node}", cb=counter(node))
    await observer.flush()
    gw, gw_errors = await _connect(server, "gateway", "g1")
    op, op_errors = await _connect(server, "operator", "mallory")
    pj, pj_errors = await _connect(server, "projector")
    answers = []
    try:
        for node, rep in (("sim", genuine["sim-m"]), ("real", genuine["real-m"])):
            sh = rep.shards[0]
            for i, (what, data) in enumerate(_forgeries(node, log_id, sh.id, sh.generation, sh.port + 1).items()):
                # The gateway and the operator publish on a subject of their own (kept in the log) ...
                gw_subject, op_subject = f"llmgw.gw.g1.forged-{node}-{i}", f"llmgw.ctl.forged-{node}-{i}"
                await gw.publish(gw_subject, data)
                await op.publish(op_subject, data)
                await gw.flush()
                await op.flush()
                # ... and each reader has the log deliver one to the node: its own, or another's (the projector).
                answers.append(await _push_to(gw, node, gw_subject))
                answers.append(await _push_to(op, node, op_subject))
                answers.append(await _push_to(pj, node, gw_subject))
        await asyncio.sleep(1.0)
    finally:
        for nc in (gw, op, pj, observer):
            await nc.close()
    print("consumers: made" if not any(answers) else f"consumers refused: {sorted(set(answers))}", seen)
    return seen


async def _forge_directly(server, genuine, log_id: str) -> dict[str, dict[str, int]]:
    # Straight onto the node's command subject, where only the control plane's
    # credential in the nodes' account reaches (bus/accounts.py): as if the
    # wall around it were breached, or a node aimed an answer of its own there.
    from llmgw.bus import accounts

    creds = accounts.commands_creds_path(server.creds("control"))
    nc = await nats.connect(server.url, user_credentials=str(creds), inbox_prefix=roles.inbox_prefix("control", "control"),
                            allow_reconnect=False)  # fmt: skip
    counts: dict[str, dict[str, int]] = {}
    signer = signing.Signer.from_file(server.auth.keys_dir / signing.SEED_FILE)
    try:
        for node, rep in (("sim", genuine["sim-m"]), ("real", genuine["real-m"])):
            sh = rep.shards[0]
            forged = _forgeries(node, log_id, sh.id, sh.generation, sh.port + 1)
            other = "real" if node == "sim" else "sim"
            stop = cmds.StopShard(shard=sh.id, generation=sh.generation, reason="replayed", term=1, log=log_id)
            forged["stop signed for another node"] = signer.seal(other, cmds.encode(stop))
            forged["not even json"] = b"\xff\x00 garbage"
            for data in forged.values():
                await nc.publish(f"{COMMAND_PREFIX}.{node}", data)
            counts[node] = {"unsigned": 4, "all": len(forged)}  # stop, start, reregister, garbage
        await nc.flush()
    finally:
        await nc.close()
    return counts
