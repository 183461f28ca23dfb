"""NATS .creds files: who one says its holder is (its user JWT's claims),
and how one is written (JWTs encoded and signed with nkeys, the seed beside
it, readable by its owner alone). Issued by the key store (keystore.py)."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .auth import ROLES, TAG_NAME, TAG_ROLE, CredentialError
from .roles import Permissions, inbox_prefix, permissions


@dataclass(frozen=True)
class Identity:
    """Who a .creds file says its holder is."""

    role: str
    name: str
    public_key: str
    path: Path

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.role, self.name)

    @property
    def permissions(self) -> Permissions:
        return permissions(self.role, self.name)

    def describe(self) -> str:
        return f"{self.role} {self.name} ({self.path})"


_CREDS_RE = re.compile(r"-----BEGIN NATS USER JWT-----\s*(\S+)\s*-+END NATS USER JWT-+.*?-----BEGIN USER NKEY SEED-----\s*(\S+)\s*", re.S)


def read_creds(path: str | os.PathLike) -> tuple[str, str]:
    """(user JWT, nkey seed) of a .creds file; a clear error when it is not one."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise CredentialError(f"cannot read the credential {path}: {e.strerror}") from None
    m = _CREDS_RE.search(text)
    if not m:
        raise CredentialError(f"{path} is not a NATS .creds file (a user JWT and an nkey seed)")
    return m.group(1), m.group(2)


def jwt_claims(token: str) -> dict:
    """The payload of a JWT, unverified (the server verifies; this says who it is for)."""
    try:
        part = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except (IndexError, ValueError) as e:
        raise CredentialError(f"not a JWT: {e}") from None


def identity(path: str | os.PathLike, *, foreign_ok: bool = False) -> Identity | None:
    """Who a credential llmgw issued is for. `foreign_ok`: None for a NATS
    credential of someone else's making (used as it is, with no llmgw role)."""
    token, _ = read_creds(path)
    claims = jwt_claims(token)
    tags = (claims.get("nats") or {}).get("tags") or []
    role = next((t[len(TAG_ROLE) :] for t in tags if t.startswith(TAG_ROLE)), "")
    name = next((t[len(TAG_NAME) :] for t in tags if t.startswith(TAG_NAME)), "")
    if role not in ROLES or not name:
        if foreign_ok:
            return None
        raise CredentialError(f"{path} is a NATS credential, but not one llmgw issued (no llmgw role in it)")
    return Identity(role=role, name=name, public_key=claims.get("sub", ""), path=Path(path))


def sign_nonce(seed: str, nonce: str) -> str:
    """The CONNECT `sig` for a server's nonce (as nats-py computes it)."""
    import nkeys

    kp = nkeys.from_seed(seed.encode())
    try:
        return base64.b64encode(kp.sign(nonce.encode())).decode()
    finally:
        kp.wipe()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def encode_jwt(claims: dict, signer) -> str:
    """A NATS JWT (header, claims, ed25519-nkey signature), as nats-io/jwt v2 writes them.

    Written here, on `nkeys` alone: the `nats-jwt` package (0.2.2) drops an
    account's `revocations` when it encodes, and a revocation the server
    never sees is none."""
    import hashlib

    claims = {"iat": int(time.time()), **claims, "iss": signer.public_key.decode()}
    claims.pop("jti", None)
    body = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    claims["jti"] = base64.b32encode(hashlib.new("sha512_256", body).digest()).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signed = f"{header}.{payload}"
    return f"{signed}.{_b64(signer.sign(signed.encode()))}"


def _new_key(prefix: int):
    import nkeys

    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _write_private(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def creds_text(jwt: str, seed: str) -> str:
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )

