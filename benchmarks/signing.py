"""What signing and checking a command costs (issue 35: commands only from the leader).

    python benchmarks/signing.py [--n N] [--repeat R]

On commands shaped like the real ones (`StartShard` of a one-GPU profile
with its engine arguments, a `StopShard` with a drain), microseconds per
command:

    encode         cmds.encode: what the control plane always paid (the yardstick)
    sign           Signer.seal: ed25519 over the node and the bytes, and the envelope
    decode         cmds.decode: what an agent always paid (the yardstick)
    verify+decode  protocol.Gate.admit with a key: the envelope, the signature, the
                   decode, the term rules (what an agent pays now)
    gate, no key   protocol.Gate.admit without one (unsigned: a dev NATS)

Each is the best of R runs (default 5) of N commands (default 20,000) over
the in-process functions: no bus, which is not what is measured. The sizes
of the command and of its envelope are printed beside.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from llmgw.agent.protocol import Gate  # noqa: E402
from llmgw.agent.statefile import AgentState  # noqa: E402
from llmgw.bus import keystore, signing  # noqa: E402
from llmgw.core.folding import commands as cmds  # noqa: E402
from llmgw.core.contract import events as ev  # noqa: E402

LOG = "LLMGW@1764806400.123"


def shaped() -> dict[str, cmds.Command]:
    profile = ev.ProfileSpec(
        name="h100", engine="vllm", gpus=1, cpu_cores=8, memory_gb=64, model="Qwen/Qwen2.5-7B-Instruct",
        args=["--max-model-len", "8192", "--gpu-memory-utilization", "0.9", "--enable-prefix-caching"],
    )  # fmt: skip
    start = cmds.StartShard(
        shard="qwen-7b-41.0", replica="qwen-7b-41", generation=3, model="qwen-7b", profile=profile,
        fingerprint="9f2c1e7a", rank=0, gpus=[5], port=20417, nodes=["gpu-0713"], term=12, log=LOG,
    )  # fmt: skip
    stop = cmds.StopShard(shard="qwen-7b-38.0", generation=2, reason="scaled down: 3 replicas wanted, 4 ready",
                          grace_s=30.0, term=12, log=LOG)  # fmt: skip
    return {"StartShard": start, "StopShard": stop}


def best(fn, n: int, repeat: int) -> float:
    """Microseconds per call, the best of `repeat` runs of `n`."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - began) / n * 1e6)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="commands per run")
    p.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        keys = keystore.Keystore(Path(tmp) / "creds").init()
        signer = signing.Signer.from_file(keys.keys_dir / signing.SEED_FILE)
        verifier = signing.Verifier.load(str(keys.folder / signing.PUBLIC_FILE))
    node = "gpu-0713"
    print(f"{'command':<11} {'bytes':>6} {'signed':>7} {'encode':>8} {'sign':>8} {'decode':>8} {'verify+decode':>14} "
          f"{'gate, no key':>13}   (µs per command, best of {args.repeat} x {args.n:,})")  # fmt: skip
    for name, cmd in shaped().items():
        data = cmds.encode(cmd)
        sealed = signer.seal(node, data)
        checked, open_gate = Gate(node, verifier), Gate(node, None)
        kept = AgentState(term=cmd.term, log=cmd.log)
        assert checked.admit(sealed, kept) == cmd and not checked.refused
        figures = [
            best(lambda: cmds.encode(cmd), args.n, args.repeat),
            best(lambda: signer.seal(node, data), args.n, args.repeat),
            best(lambda: cmds.decode(data), args.n, args.repeat),
            best(lambda: checked.admit(sealed, kept), args.n, args.repeat),
            best(lambda: open_gate.admit(data, kept), args.n, args.repeat),
        ]
        enc, sign, dec, verify, unsigned = figures
        print(f"{name:<11} {len(data):>6} {len(sealed):>7} {enc:>8.2f} {sign:>8.1f} {dec:>8.2f} {verify:>14.1f} {unsigned:>13.2f}")


if __name__ == "__main__":
    main()
