"""llama.cpp's server options, as a profile's `args` write them, onto
xllamacpp's `CommonParams`.

The engine wrapper once knew five options, so `--pooling mean` (what an
embeddings profile needs: llama.cpp refuses pooling `none` for the OpenAI
API) was "unrecognized arguments", and five failed starts later the model
was parked (issue 31). xllamacpp has no command line of its own: it takes a
`CommonParams`, whose fields are llama.cpp's `common_params`. So options are
passed through by name: llama-server's flags that name a field differently
are in ALIASES (with their short forms), and any other `--some-option` sets
the field `some_option` when CommonParams has one (`--no-some-option` turns a
boolean off). A value is converted to the field's type; an enum's by the end
of its members' names (`--pooling mean`: LLAMA_POOLING_TYPE_MEAN,
`--cache-type-k q8_0`: GGML_TYPE_Q8_0). Anything else is an error that names
the option, said before llama.cpp is started.

`--chat-template` takes a Jinja template or the name of one llmgw ships
(chat_templates.BUILTIN); `--chat-template-file` a file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .chat_templates import BUILTIN


class OptionError(ValueError):
    """An option the wrapper cannot give llama.cpp; the message names it."""


@dataclass(frozen=True)
class Field:
    path: str  # attribute of CommonParams, dotted for a nested one ("sampling.temp")
    flag: object = None  # set to this, taking no value (None: takes a value)


# llama-server's names that are not the field's name.
ALIASES: dict[str, Field] = {
    "-c": Field("n_ctx"), "--ctx-size": Field("n_ctx"),
    "-np": Field("n_parallel"), "--parallel": Field("n_parallel"),
    "-ngl": Field("n_gpu_layers"), "--gpu-layers": Field("n_gpu_layers"), "--n-gpu-layers": Field("n_gpu_layers"),
    "-b": Field("n_batch"), "--batch-size": Field("n_batch"),
    "-ub": Field("n_ubatch"), "--ubatch-size": Field("n_ubatch"),
    "-n": Field("n_predict"), "--n-predict": Field("n_predict"), "--predict": Field("n_predict"),
    "--keep": Field("n_keep"), "--cache-reuse": Field("n_cache_reuse"), "--threads-http": Field("n_threads_http"),
    "--embedding": Field("embedding", True), "--embeddings": Field("embedding", True),
    "--pooling": Field("pooling_type"),
    "--jinja": Field("use_jinja", True), "--no-jinja": Field("use_jinja", False),
    "-fa": Field("flash_attn_type"), "--flash-attn": Field("flash_attn_type"),
    "-ctk": Field("cache_type_k"), "--cache-type-k": Field("cache_type_k"),
    "-ctv": Field("cache_type_v"), "--cache-type-v": Field("cache_type_v"),
    "--context-shift": Field("ctx_shift", True), "--no-context-shift": Field("ctx_shift", False),
    "-cb": Field("cont_batching", True), "--cont-batching": Field("cont_batching", True),
    "-nocb": Field("cont_batching", False), "--no-cont-batching": Field("cont_batching", False),
    "-sps": Field("slot_prompt_similarity"), "--slot-prompt-similarity": Field("slot_prompt_similarity"),
    "-kvu": Field("kv_unified", True), "--kv-unified": Field("kv_unified", True),
    "--temp": Field("sampling.temp"), "--top-k": Field("sampling.top_k"), "--top-p": Field("sampling.top_p"),
    "--min-p": Field("sampling.min_p"), "-s": Field("sampling.seed"), "--seed": Field("sampling.seed"),
    "--repeat-penalty": Field("sampling.penalty_repeat"),
}  # fmt: skip

# Values llama-server takes that are not an enum member's ending.
WORDS = {"on": "ENABLED", "off": "DISABLED", "true": "ENABLED", "false": "DISABLED"}
# What the wrapper decides itself: its own options (llamacpp_server.parser).
OWN = {"--model", "--host", "--port", "--alias", "--threads", "-t", "--api-key"}


def _field(option: str, params) -> tuple[Field, bool]:
    """The field an option sets, and whether it was found by name (not an alias)."""
    if option in ALIASES:
        return ALIASES[option], False
    if not option.startswith("--"):
        raise OptionError(f"llama.cpp option {option} is not known to llmgw's engine wrapper: write its long form (--name)")
    name = option[2:].replace("-", "_")
    if hasattr(params, name) and not name.startswith("_"):
        return Field(name), True
    if name.startswith("no_") and isinstance(getattr(params, name[3:], None), bool):
        return Field(name[3:], False), True
    raise OptionError(
        f"llama.cpp option {option} is not known to llmgw's engine wrapper (xllamacpp's CommonParams has no field "
        f"{name}); see llmgw/agent/llamacpp_options.py for the names it takes"
    )


def _convert(option: str, current, value: str):
    """`value` as the type of the field's current value."""
    try:
        if isinstance(current, bool):
            if value.lower() in ("1", "true", "on", "yes"):
                return True
            if value.lower() in ("0", "false", "off", "no"):
                return False
            raise ValueError(value)
        if isinstance(current, int) and not hasattr(type(current), "__members__"):
            return int(value)
        if isinstance(current, float):
            return float(value)
        if isinstance(current, str):
            return value
    except ValueError:
        raise OptionError(f"llama.cpp option {option}: {value!r} is not a {type(current).__name__}") from None
    members = getattr(type(current), "__members__", None)
    if members:
        want = WORDS.get(value.lower(), value.upper())
        for name, member in members.items():
            if name.endswith("_" + want):
                return member
        ends = sorted({n.rsplit("_", 1)[-1].lower() for n in members})
        raise OptionError(f"llama.cpp option {option}: {value!r} is not one of {', '.join(ends)}")
    raise OptionError(f"llama.cpp option {option} sets a field of type {type(current).__name__}, which the wrapper cannot set")


def _set(params, path: str, value) -> None:
    *parents, last = path.split(".")
    obj = params
    for p in parents:
        obj = getattr(obj, p)
    setattr(obj, last, value)


def _get(params, path: str):
    obj = params
    for p in path.split("."):
        obj = getattr(obj, p)
    return obj


def _template(option: str, value: str) -> str:
    if option == "--chat-template-file":
        try:
            return Path(value).read_text()
        except OSError as e:
            raise OptionError(f"llama.cpp option --chat-template-file: cannot read {value}: {e.strerror or e}") from None
    return BUILTIN.get(value, value)


def apply(params, args: list[str]) -> list[str]:
    """Set `args` (llama-server's options) on `params`; the options set, in
    words, for the log. Raises OptionError naming the first it cannot set."""
    done: list[str] = []
    i = 0
    while i < len(args):
        option, value = args[i], None
        if "=" in option and option.startswith("--"):
            option, value = option.split("=", 1)
        if option in OWN:
            raise OptionError(f"{option} is the wrapper's own option, not llama.cpp's")
        if option in ("--reranking", "--rerank"):
            import xllamacpp

            params.embedding = True
            params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_RANK
            done.append("reranking")
            i += 1
            continue
        if option in ("--chat-template", "--chat-template-file"):
            if value is None:
                if i + 1 >= len(args):
                    raise OptionError(f"llama.cpp option {option} takes a value")
                value, i = args[i + 1], i + 1
            params.chat_template = _template(option, value)
            done.append(f"{option} {value if option.endswith('file') or value in BUILTIN else '(inline)'}")
            i += 1
            continue
        field, _ = _field(option, params)
        current = _get(params, field.path)
        if field.flag is not None:
            _set(params, field.path, field.flag)
            done.append(f"{field.path}={field.flag}")
            i += 1
            continue
        if value is None:
            if isinstance(current, bool) and (i + 1 >= len(args) or args[i + 1].startswith("-")):
                _set(params, field.path, True)  # a boolean field named as a flag
                done.append(f"{field.path}=True")
                i += 1
                continue
            if i + 1 >= len(args):
                raise OptionError(f"llama.cpp option {option} takes a value")
            value, i = args[i + 1], i + 1
        _set(params, field.path, _convert(option, current, value))
        done.append(f"{field.path}={value}")
        i += 1
    return done
