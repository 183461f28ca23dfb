"""`llmgw completion bash|zsh|fish`: a shell completion script.

Made from the command line's own parser (llmgw/cli/main.py), so it never
drifts from it: every command and verb, every flag of each, the values of
flags that have a few (`-o`, `--priority`…), the kinds `get`, `describe`
and `delete` take by any of their names, and the names of models,
replicas and nodes. Names are asked of `llmgw completion --names KIND` at
each Tab: it reads the local read models (SQLite) and nothing else, no
NATS, so it is quick and quiet, and prints nothing where there are none.

The scripts share one table per shell (command path → its words) and a
small walker: the words before the cursor that name a subcommand of the
path so far extend it; a flag that takes a value skips its value; the rest
are positionals, counted, so `ctl get replica <Tab>` offers replicas' ids.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh", "fish")
# A positional's names, asked at Tab: "@KIND" names of that kind; "@kind" the kind given before it.
NAME_SOURCES = {
    ("ctl get", "names"): "@kind", ("ctl describe", "name"): "@kind", ("ctl delete", "name"): "@kind",
    ("ctl restart", "replicas"): "@replicas", ("ctl logs", "replica"): "@replicas",
    ("ctl retry", "model"): "@models", ("ctl explain-placement", "model"): "@models",
    ("ctl label", "node"): "@nodes", ("ctl node admit", "node"): "@nodes", ("ctl node unmute", "node"): "@nodes",
}  # fmt: skip


@dataclass
class Command:
    """What completes after one command path (`ctl get`)."""

    subs: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    valued: list[str] = field(default_factory=list)  # flags that take a value (its word is skipped)
    choices: dict[str, list[str]] = field(default_factory=dict)  # flag -> its values
    positionals: list[str] = field(default_factory=list)  # each: words, or "@…" (NAME_SOURCES)
    repeats: bool = False  # the last positional takes more than one word


def commands(p: argparse.ArgumentParser) -> dict[str, Command]:
    """Every command path of the parser (the root is ""), with what completes after it."""
    out: dict[str, Command] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        here = out.setdefault(path, Command())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen: set[int] = set()
                for name, sub in action.choices.items():
                    here.subs.append(name)
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        walk(sub, f"{path} {name}".strip())
            elif action.option_strings:
                if action.help == argparse.SUPPRESS:
                    continue
                here.flags += action.option_strings
                if action.nargs != 0:
                    here.valued += action.option_strings
                    values = _values(action)
                    if values:
                        for flag in action.option_strings:
                            here.choices[flag] = values
            else:
                source = NAME_SOURCES.get((path, action.dest))
                here.positionals.append(source or " ".join(_values(action)))
                here.repeats = action.nargs in ("*", "+")

    walk(p, "")
    return out


def _values(action: argparse.Action) -> list[str]:
    if action.choices is not None:
        return [str(c) for c in action.choices]
    offered = getattr(action.type, "completions", None)  # a kind's names (ctl.kind_type), -o's words
    return list(offered) if offered else []


def names(kind: str) -> list[str]:
    """The names of a kind in the local read models, for a Tab: [] when there are none or none can be read."""
    from ..ctl.locate import locate
    from ..ctl.readmodels import ReadModels
    from ..ctl.views import ALIASES

    kind = ALIASES.get(kind.lower(), kind.lower())
    try:
        where = locate(None, None, None)
        if where.db is None:
            return []
        models = ReadModels(where.db)
        if kind == "models":
            return [m["name"] for m in models.models()]
        if kind == "replicas":
            return [r["id"] for r in models.replicas()]
        if kind == "nodes":
            return [n["name"] for n in models.nodes()]
        if kind == "domains":
            return [d["domain"] for d in models.domains()]
        if kind == "quotas":
            return [q["owner"] for q in models.quotas()]
    except Exception:  # a completion never speaks: no read models, a locked file, a bad environment
        return []
    return []


# --------------------------------------------------------------------------- the scripts


def _q(text: str) -> str:
    """Single-quoted for bash, zsh and fish alike (no single quote inside our words)."""
    assert "'" not in text, text
    return f"'{text}'"


def _table(cmds: dict[str, Command]) -> list[tuple[str, str, str]]:
    """(kind of entry, key, words): the data every script is made of."""
    rows = []
    for path, c in cmds.items():
        path = f"llmgw {path}".strip()  # never an empty key: bash's associative arrays refuse one
        rows.append(("subs", path, " ".join(c.subs)))
        rows.append(("flags", path, " ".join(c.flags)))
        rows.append(("valued", path, " ".join(c.valued)))
        for flag, values in c.choices.items():
            rows.append(("choices", f"{path}|{flag}", " ".join(values)))
        for i, words in enumerate(c.positionals):
            rows.append(("pos", f"{path}|{i}", words))
        if c.repeats and c.positionals:
            rows.append(("pos", f"{path}|*", c.positionals[-1]))
    return rows


def _walk(word, cursor: str, first: int) -> str:
    """The walker bash and zsh share (see the module's doc): it leaves in
    `offer` the words to offer for the word at the cursor. `word(index)`
    reads a word of the command line; `cursor` is its index, `first` the
    index of the word after `llmgw` (bash counts from 0, zsh from 1)."""
    return f"""  local cur="{word(cursor)}" prev="{word(cursor + '-1')}" cmd="llmgw" w i n=0 kind="" skip=0 offer=""
  for ((i = {first}; i < {cursor}; i++)); do
    w="{word('i')}"
    if ((skip)); then skip=0; continue; fi
    if [[ $w == -* ]]; then
      [[ " ${{_llmgw_valued[$cmd]}} " == *" $w "* ]] && skip=1
      continue
    fi
    if ((n == 0)) && [[ " ${{_llmgw_subs[$cmd]}} " == *" $w "* ]]; then
      cmd="$cmd $w"
      continue
    fi
    ((n == 0)) && kind="$w"
    ((n++))
  done
  if ((skip)); then
    offer="${{_llmgw_choices[$cmd|$prev]}}"
  elif [[ $cur == -* ]]; then
    offer="${{_llmgw_flags[$cmd]}}"
  elif ((n == 0)) && [[ -n ${{_llmgw_subs[$cmd]}} ]]; then
    offer="${{_llmgw_subs[$cmd]}}"
  else
    offer="${{_llmgw_pos[$cmd|$n]:-${{_llmgw_pos[$cmd|*]}}}}"
    case "$offer" in
      @kind) offer="$(llmgw completion --names "$kind" 2>/dev/null)" ;;
      @*) offer="$(llmgw completion --names "${{offer#@}}" 2>/dev/null)" ;;
    esac
  fi
"""


def _tables(cmds: dict[str, Command], entry, declare) -> str:
    """The tables as associative arrays: `entry(key, words)` a line of one, `declare(name, lines)` one."""
    tables: dict[str, list[str]] = {"subs": [], "flags": [], "valued": [], "choices": [], "pos": []}
    for kind, key, words in _table(cmds):
        if words:
            tables[kind].append(entry(key, words))
    return "\n".join(declare(f"_llmgw_{k}", v) for k, v in tables.items())


def bash(cmds: dict[str, Command]) -> str:
    decl = _tables(cmds, lambda k, w: f"  [{_q(k)}]={_q(w)}", lambda name, lines: f"declare -gA {name}=(\n" + "\n".join(lines) + "\n)")
    walk = _walk(lambda i: f"${{COMP_WORDS[{i}]}}", "COMP_CWORD", 1)
    return f"""# llmgw completion for bash: `source <(llmgw completion bash)`, or save it as
# /etc/bash_completion.d/llmgw. Made from llmgw's own parser; names come from
# `llmgw completion --names KIND` (the local read models, no NATS).
{decl}

_llmgw() {{
{walk}  COMPREPLY=($(compgen -W "$offer" -- "$cur"))
  # A value to go on (jsonpath=, custom-columns=): no space after it.
  [[ ${{#COMPREPLY[@]}} == 1 && ${{COMPREPLY[0]}} == *= ]] && compopt -o nospace 2>/dev/null
  return 0
}}
complete -o default -F _llmgw llmgw
"""


def zsh(cmds: dict[str, Command]) -> str:
    decl = _tables(cmds, lambda k, w: f"  {_q(k)} {_q(w)}", lambda name, lines: f"typeset -gA {name}\n{name}=(\n" + "\n".join(lines) + "\n)")
    walk = _walk(lambda i: f"${{words[{i}]}}", "CURRENT", 2)
    return f"""#compdef llmgw
# llmgw completion for zsh: `source <(llmgw completion zsh)` (after compinit), or
# save it as _llmgw in a folder of $fpath. Made from llmgw's own parser; names
# come from `llmgw completion --names KIND` (the local read models, no NATS).
{decl}

_llmgw() {{
{walk}  local -a choices
  choices=(${{=offer}})
  compadd -- ${{choices:#*=}}
  # A value to go on (jsonpath=, custom-columns=): no space after it.
  (( ${{#${{(M)choices:#*=}}}} )) && compadd -S '' -- ${{(M)choices:#*=}}
  return 0
}}
if (( $+functions[compdef] )); then
  compdef _llmgw llmgw
fi
"""


def fish(cmds: dict[str, Command]) -> str:
    lines = []
    for kind, key, words in _table(cmds):
        if words:
            lines.append(f"set -g __llmgw_{kind}_{_fish_key(key)} {_q(words)}")
    data = "\n".join(lines)
    return f"""# llmgw completion for fish: `llmgw completion fish | source`, or save it as
# ~/.config/fish/completions/llmgw.fish. Made from llmgw's own parser; names
# come from `llmgw completion --names KIND` (the local read models, no NATS).
{data}

function __llmgw_key
    # A variable's name for a table's key: what is not a letter or digit becomes _.
    string replace -ra '[^A-Za-z0-9]' _ -- $argv[1]
end

function __llmgw_get
    set -l var __llmgw_$argv[1]_(__llmgw_key $argv[2])
    if set -q $var
        string split ' ' -- $$var
    end
end

function __llmgw_complete
    set -l tokens (commandline -opc)
    set -l cur (commandline -ct)
    set -l cmd llmgw
    set -l n 0
    set -l kind ''
    set -l skip 0
    set -l prev ''
    for w in $tokens[2..-1]
        set prev $w
        if test $skip -eq 1
            set skip 0
            continue
        end
        if string match -q -- '-*' $w
            if contains -- $w (__llmgw_get valued "$cmd")
                set skip 1
            end
            continue
        end
        if test $n -eq 0; and contains -- $w (__llmgw_get subs "$cmd")
            set cmd "$cmd $w"
            continue
        end
        if test $n -eq 0
            set kind $w
        end
        set n (math $n + 1)
    end
    if test $skip -eq 1
        __llmgw_get choices "$cmd|$prev"
    else if string match -q -- '-*' $cur
        __llmgw_get flags "$cmd"
    else if test $n -eq 0; and test (count (__llmgw_get subs "$cmd")) -gt 0
        __llmgw_get subs "$cmd"
    else
        set -l offer (__llmgw_get pos "$cmd|$n")
        if test -z "$offer"
            set offer (__llmgw_get pos "$cmd|*")
        end
        switch "$offer"
            case '@kind'
                llmgw completion --names $kind 2>/dev/null
            case '@*'
                llmgw completion --names (string sub -s 2 -- $offer) 2>/dev/null
            case '*'
                printf '%s\\n' $offer
        end
    end
end

complete -c llmgw -f -a '(__llmgw_complete)'
"""


def _fish_key(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key)


def script(shell: str, p: argparse.ArgumentParser) -> str:
    cmds = commands(p)
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](cmds)
