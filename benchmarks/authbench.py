"""Auth for the benchmarks: the same server set-up as `llmgw up` (bus/auth.py),
and a loader credential that may publish a recorded log of every speaker.

The loader exists only here: a recorded log holds agents', gateways',
operators' and the control plane's events, which no credential of the product
may all publish (that is the point of them)."""

from __future__ import annotations

from pathlib import Path

from llmgw.bus import auth


def keystore(folder: Path) -> auth.Keystore:
    return auth.Keystore(folder).init()


def loader_creds(keys: auth.Keystore) -> str:
    import nkeys

    user = auth._new_key(nkeys.PREFIX_BYTE_USER)
    claims = {
        "sub": user.public_key.decode(), "name": "benchmark-loader",
        "nats": {"type": "user", "version": 2, "pub": {"allow": [">"]}, "sub": {"allow": ["_INBOX.>"]},
                 "subs": -1, "data": -1, "payload": -1},
    }  # fmt: skip
    token = auth.encode_jwt(claims, keys._seed("account", None))
    path = keys.folder / "benchmark-loader.creds"
    path.write_text(auth.creds_text(token, user.seed.decode()))
    path.chmod(0o600)
    return str(path)
