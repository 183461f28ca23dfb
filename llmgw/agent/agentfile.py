"""The agent file: what a node has that the agent cannot find out by itself.

YAML, validated with pydantic; an error names the file, the line and the
field (as a catalog's does) and the agent does not start.

    # where engines listen, and the host of the endpoints others reach
    address: 10.1.2.3
    # only where NVML finds no GPU: a CPU-only machine declares its (none, or
    # pretend) GPUs here; NVML's answer wins where there is one
    gpus:
      - {index: 0, model: "NVIDIA H100 80GB HBM3", memory_gb: 80, power_w: 700}
    cpu_cores: 32          # for shards; default: the cores this process may use
    memory_gb: 512         # for shards; default: the machine's memory
    hcas: [mlx5_0, mlx5_1] # reported as the label llmgw.io/hcas (comma-separated)
    labels:
      llmgw.io/site: par1
      llmgw.io/room: r2
      llmgw.io/row: "4"
      llmgw.io/rack: r4-12
      llmgw.io/pdu: pdu-a
      llmgw.io/pool: prod
      llmgw.io/fabric: ib-1
    models:                # names a profile's `model` may use, and where the weights are here
      qwen-7b: /models/qwen2.5-7b-instruct-q4_k_m.gguf   # "./x" and "../x": relative to this file
      qwen-hub: Qwen/Qwen2.5-7B-Instruct                  # anything else: passed to the engine as written
    engines:               # the engine kinds this node runs, and where each one's program is ("": the default)
      llama.cpp: ""
      vllm: /opt/vllm/bin/vllm
      sglang: /opt/sglang/bin/python
    templates:             # the command templates a profile may name (`engine: my-server`)
      my-server: /opt/my/server --port {port} --model {model} --gpus {gpus}
    start_timeout_s: 900   # not healthy by then: the shard failed
    stop_timeout_s: 10     # after SIGTERM, SIGKILL
    engine_ports: 20000-29999  # the ports its engines may listen on (first-last); `llmgw agent --engine-ports`
    command_key: /etc/llmgw/commands.pub  # the control plane's command key (or the key itself, N...); `--command-key`
    max_term_jump: 1000    # a command more terms than this past the highest seen is refused (0: no bound)

A node runs only what its agent file declares: the engine kinds under
`engines` (default: `llama.cpp` alone, the CPU engine that runs llmgw's own
xllamacpp server) and the command templates under `templates`, which a
catalog profile names (`engine: my-server`) and may give arguments to. A
start command naming anything else fails its shard with the reason. A
profile's engine was once a command line run as written: anyone who could
publish a start command ran `sh -c '…'` as root on every node, and an
operator's typo ran whatever it named.

Labels under `llmgw.io/` are the ones llmgw reads; a typo there is an error
rather than a label nobody reads. Other labels pass through as they are.

`engine_ports` is told to the control plane, which numbers engine ports
within it; the agent says which of them another program holds (at
registration, when it refuses a start on one, and when one is free again),
so that they are not handed out.

`command_key` is the public key (`creds/commands.pub` of the key store)
of the control plane's command-signing key: the agent acts only on commands
signed with it (agent/protocol.py). It is the operator's to give, never
learned from the bus: issue 35 found that any credential reading the log
could make NATS deliver a forged command to a node.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import yamlfile
from ..core.contract.limits import LIMITS
from .protocol import MAX_TERM_JUMP

KNOWN_LABELS = frozenset(
    f"llmgw.io/{k}" for k in ("site", "room", "row", "rack", "pdu", "pool", "fabric", "simulated")
)
HCAS_LABEL = "llmgw.io/hcas"
ENGINE_KINDS = ("llama.cpp", "vllm", "sglang")
# What a node runs when its agent file declares no engines: the CPU engine,
# which runs llmgw's own xllamacpp server and nothing a profile names.
DEFAULT_ENGINES = {"llama.cpp": ""}


class AgentFileError(ValueError):
    pass


class GpuDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    model: str = ""
    memory_gb: float = Field(0.0, ge=0)
    # Its power limit in watts: what a shard on it is counted as drawing
    # until the agent measures one (core/scheduling/facility.py). 0: not said.
    power_w: float = Field(0.0, ge=0)


class PortRange(BaseModel):
    """Ports first to last, both included; written "20000-29999"."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    first: int = Field(ge=1, le=65535)
    last: int = Field(ge=1, le=65535)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, v):
        if isinstance(v, (str, int)):  # YAML reads a lone port as a number
            first, dash, last = str(v).strip().partition("-")
            if not dash or not first.strip().isdigit() or not last.strip().isdigit():
                raise ValueError(f"a range of ports, first-last (such as {DEFAULT_ENGINE_PORTS_TEXT}), not {v!r}")
            return {"first": int(first), "last": int(last)}
        return v

    @model_validator(mode="after")
    def _ordered(self) -> "PortRange":
        if self.first > self.last:
            raise ValueError(f"the first port ({self.first}) is after the last ({self.last})")
        return self

    @classmethod
    def parse(cls, text: str) -> "PortRange":
        """From "first-last" (a flag's value); raises ValueError saying what is wrong."""
        from pydantic import ValidationError

        try:
            return cls.model_validate(text)
        except ValidationError as e:
            raise ValueError("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())) from None

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def __contains__(self, port: int) -> bool:
        return self.first <= port <= self.last


# The control plane's default range (core/contract/limits.py), which an agent that says none gets.
DEFAULT_ENGINE_PORTS = PortRange(first=LIMITS.engine_port_first, last=LIMITS.engine_port_last)
DEFAULT_ENGINE_PORTS_TEXT = str(DEFAULT_ENGINE_PORTS)


class AgentFile(BaseModel):
    """An agent file, as loaded (every field has a default: no file is an empty one)."""

    model_config = ConfigDict(extra="forbid")
    address: str = "127.0.0.1"
    gpus: list[GpuDecl] = []
    cpu_cores: int = Field(0, ge=0)  # 0: what the machine has
    memory_gb: float = Field(0.0, ge=0)  # 0: what the machine has
    hcas: list[str] = []
    labels: dict[str, str] = {}
    models: dict[str, str] = {}
    engines: dict[str, str] = DEFAULT_ENGINES  # kind -> its program ("" : the default)
    templates: dict[str, str] = {}  # name -> command template
    start_timeout_s: float = Field(900.0, gt=0)
    stop_timeout_s: float = Field(10.0, gt=0)
    engine_ports: PortRange = DEFAULT_ENGINE_PORTS
    command_key: str = ""  # the control plane's public command key, or a file holding it ("": none, or found)
    max_term_jump: int = Field(MAX_TERM_JUMP, ge=0)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if not v or any(c.isspace() or c in "/:" for c in v):
                raise ValueError("an IP address or a host name") from None
        return v

    def problems(self) -> list[tuple[tuple, str]]:
        """(location, message) of what the types alone do not catch, each at its own line."""
        out: list[tuple[tuple, str]] = []
        seen: set[int] = set()
        for i, g in enumerate(self.gpus):
            if g.index in seen:
                out.append((("gpus", i, "index"), f"GPU index {g.index} is declared twice"))
            seen.add(g.index)
        known = ", ".join(sorted(KNOWN_LABELS))
        for key in self.labels:
            if key == HCAS_LABEL:
                out.append((("labels", key), f"{HCAS_LABEL} comes from `hcas`, not from a label"))
            elif key.startswith("llmgw.io/") and key not in KNOWN_LABELS:
                out.append((("labels", key), f"{key} is not a label llmgw reads (known: {known})"))
        for kind in self.engines:
            if kind not in ENGINE_KINDS:
                out.append((
                    ("engines", kind),
                    f"{kind} is not an engine kind ({', '.join(ENGINE_KINDS)}); a command goes under `templates`",
                ))
        for name, command in self.templates.items():
            if name in ENGINE_KINDS or name == "sim":
                out.append((("templates", name), f"{name} is an engine kind: name the template otherwise"))
            elif not command.strip():
                out.append((("templates", name), "an empty command"))
        return out

    def node_labels(self) -> dict[str, str]:
        labels = dict(self.labels)
        if self.hcas:
            labels[HCAS_LABEL] = ",".join(self.hcas)
        return labels


def load(path: str | Path | None) -> AgentFile:
    """The agent file at `path`; None: the empty one."""
    if path is None:
        return AgentFile()
    path = Path(path)
    try:
        loaded, root = yamlfile.load(path, AgentFile)
    except yamlfile.YamlFileError as e:
        raise AgentFileError(str(e)) from None
    problems = loaded.problems()
    if problems:
        raise AgentFileError(yamlfile.problems(path, root, problems))
    # "./x.gguf" and "../x" are relative to the file; anything else is kept
    # as written (an absolute path, or a hub id such as Qwen/Qwen2.5-7B).
    if loaded.command_key.startswith(("./", "../")):  # a file beside this one, as models' paths
        loaded.command_key = str((path.parent / loaded.command_key).resolve())
    loaded.models = {
        k: str((path.parent / v).resolve()) if v.startswith(("./", "../")) else v for k, v in loaded.models.items()
    }
    return loaded


def dump(agent_file: AgentFile) -> str:
    """YAML for an agent file (what `llmgw up` writes for its machine)."""
    data = agent_file.model_dump(exclude_defaults=True)
    if "engine_ports" in data:
        data["engine_ports"] = str(agent_file.engine_ports)  # as people write it
    return yaml.safe_dump(data, sort_keys=False)
