"""What a node has, as its agent reports it when it registers.

GPUs come from NVML (the `nvidia-ml-py` package, imported only if it is
installed) where it finds at least one; otherwise from the agent file, which
is how a CPU-only machine runs the demo (it declares none, or pretend ones).
CPU cores, memory, HCAs and labels come from the agent file; cores and
memory default to what this machine has.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable

from ..core.contract import events as ev
from .agentfile import AgentFile
from .power import nvml_power_limit

log = logging.getLogger("llmgw.agent")


@dataclass
class Inventory:
    gpus: list[ev.Gpu]
    cpu_cores: int
    memory_gb: float
    labels: dict[str, str] = field(default_factory=dict)
    gpu_source: str = "agent file"  # or "nvml"

    def describe(self) -> str:
        gpus = ", ".join(f"{g.index}: {g.model or '?'} {g.memory_gb:g} GB" for g in self.gpus) or "none"
        return f"GPUs ({self.gpu_source}): {gpus}; {self.cpu_cores} CPU cores; {self.memory_gb:g} GB memory"


def nvml_gpus() -> list[ev.Gpu] | None:
    """The GPUs NVML sees; None where NVML is not installed, has no driver, or finds none."""
    try:
        import pynvml  # nvidia-ml-py: optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver, no device: a CPU machine
        log.debug("NVML: %s", e)
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(ev.Gpu(index=i, model=name, memory_gb=round(memory / 2**30, 1), power_w=nvml_power_limit(handle)))
        return gpus or None
    except Exception as e:
        log.warning("NVML could not list the GPUs (%s); using the agent file", e)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0  # not said: placement then does not count memory here


def discover(agent_file: AgentFile, nvml: Callable[[], list[ev.Gpu] | None] = nvml_gpus) -> Inventory:
    found = nvml()
    if found:
        if agent_file.gpus:
            log.warning("NVML finds %d GPU(s): the GPUs of the agent file are not used", len(found))
        gpus, source = found, "nvml"
    else:
        gpus = [ev.Gpu(index=g.index, model=g.model, memory_gb=g.memory_gb, power_w=g.power_w) for g in agent_file.gpus]
        source = "agent file"
    return Inventory(
        gpus=gpus,
        cpu_cores=agent_file.cpu_cores or machine_cores(),
        memory_gb=agent_file.memory_gb or machine_memory_gb(),
        labels=agent_file.node_labels(),
        gpu_source=source,
    )
