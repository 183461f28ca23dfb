"""Who may use which model: the rule the gateways apply to every API key.

Owners are paths ("org", "org/team", "org/team/project"). A model belongs to
an owner, or to no one ("": shared by all). A key belongs to one owner and
reaches the models of that owner and of every owner above it, and the
shared ones: a team uses its organisation's models, not its sister team's.
"""

from __future__ import annotations

from ..folding.state import ApiKey, State


def may_use(key_owner: str, model_owner: str) -> bool:
    """Whether a key of `key_owner` may use a model of `model_owner`."""
    if not model_owner:
        return True
    return key_owner == model_owner or key_owner.startswith(model_owner + "/")


def keys_by_hash(state: State) -> dict[str, tuple[str, ApiKey]]:
    """SHA-256 (hex) of a key -> (the key's name, the key), for the keys in the
    catalog. Two names with the same hash: the first one applied wins."""
    out: dict[str, tuple[str, ApiKey]] = {}
    for name, key in state.api_keys.items():
        out.setdefault(key.key_sha256.lower(), (name, key))
    return out
