"""`llmgw completion bash|zsh|fish` (issue 34): each script loads in its
shell and completes as a person's Tab would, through the real `llmgw`
command (a wrapper on PATH runs this checkout). Bash always (CI has it);
zsh and fish where they are installed. The names of models, replicas and
nodes at a Tab come from read models: tests/test_kubectl_e2e.py checks them
against a real `llmgw up`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.cli.main import parser
from llmgw.ctl import completion

REPO = Path(__file__).resolve().parent.parent


def llmgw_on_path(tmp_path: Path) -> dict[str, str]:
    """An environment where `llmgw` is this checkout, run by this Python, in a folder with no llmgw up."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "llmgw"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m llmgw "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}".rstrip(":")
    return env


def complete_in_bash(env: dict[str, str], cwd: Path, *words: str) -> list[str]:
    """What bash's Tab offers after `words` (the last is the one being typed), from the script `llmgw completion bash` prints."""
    quoted = " ".join("'" + w + "'" for w in words)
    script = (
        "source <(llmgw completion bash) || exit 9\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _llmgw\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr, out.stderr
    return [w for w in out.stdout.splitlines() if w]


def test_the_bash_script_loads_and_registers_llmgw(tmp_path):
    env = llmgw_on_path(tmp_path)
    out = subprocess.run(["bash", "-c", "source <(llmgw completion bash) && complete -p llmgw"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "complete -o default -F _llmgw llmgw"


def test_bash_completes_commands_verbs_kinds_flags_and_their_values(tmp_path):
    env = llmgw_on_path(tmp_path)
    tab = lambda *w: complete_in_bash(env, tmp_path, "llmgw", *w)  # noqa: E731
    assert tab("ct") == ["ctl"]
    assert tab("ctl", "ge") == ["get"]  # a verb
    assert tab("ctl", "get", "rep") == ["replicas", "replica"]  # a kind by its names
    assert "apikeys" in tab("ctl", "get", "") and "owners" in tab("ctl", "get", "")
    assert tab("ctl", "describe", "no") == ["nodes", "node", "no"]
    assert tab("ctl", "delete", "") == ["model", "owner", "apikey"]
    assert tab("ctl", "get", "rs", "--sel") == ["--selector"]  # a flag of that verb
    assert tab("ctl", "get", "rs", "--sort") == ["--sort-by"]
    assert tab("ctl", "get", "rs", "-o", "j") == ["json", "jsonpath="]  # a flag's values
    assert tab("ctl", "--nats", "nats://x:1", "ge") == ["get"]  # a flag's value is skipped
    assert tab("completion", "") == ["bash", "zsh", "fish"]
    assert tab("creds", "issue", "ag") == ["agent"]
    # No read models here: names complete to nothing, and nothing is said.
    assert tab("ctl", "get", "replicas", "") == []


def test_every_command_and_flag_of_the_parser_is_in_the_tables():
    cmds = completion.commands(parser())
    assert "get" in cmds["ctl"].subs and "hold" in cmds["ctl facility"].subs
    assert {"-l", "--selector", "--sort-by", "-o", "--watch"} <= set(cmds["ctl get"].flags)
    assert cmds["ctl get"].positionals[1] == "@kind" and cmds["ctl get"].repeats
    assert cmds["ctl restart"].positionals == ["@replicas"]
    assert "--names" not in cmds["completion"].flags  # the scripts' own helper is not offered


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_the_zsh_script_loads_and_completes(tmp_path):
    env = llmgw_on_path(tmp_path)
    script = (
        "source <(llmgw completion zsh) || exit 9\n"
        # compadd, outside a completion widget: print what would be offered (zsh filters by prefix itself).
        'compadd() { local a; for a in "$@"; do [[ $a == -* ]] || print -r -- "$a"; done }\n'
        "words=(llmgw ctl g); CURRENT=3; _llmgw\n"
        "print -- ---\n"
        "words=(llmgw ctl get rs -o ''); CURRENT=6; _llmgw\n"
    )
    out = subprocess.run(["zsh", "-f", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    verbs, outputs = out.stdout.split("---\n")
    assert "get" in verbs.split() and "describe" in verbs.split()
    assert outputs.split() == ["table", "wide", "name", "json", "yaml", "jsonpath=", "custom-columns="]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_the_fish_script_loads_and_completes(tmp_path):
    env = llmgw_on_path(tmp_path)
    script = "llmgw completion fish | source; complete -C 'llmgw ctl ge'; echo ---; complete -C 'llmgw ctl get rs -o j'"
    out = subprocess.run(["fish", "--no-config", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    verbs, outputs = out.stdout.split("---\n")
    assert verbs.split() == ["get"]
    assert sorted(outputs.split()) == ["json", "jsonpath="]


def test_no_shell_named_is_bad_input(tmp_path):
    env = llmgw_on_path(tmp_path)
    out = subprocess.run(["llmgw", "completion"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "name a shell: bash, zsh, fish" in out.stderr
    out = subprocess.run(["llmgw", "completion", "tcsh"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice" in out.stderr
