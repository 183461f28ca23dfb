"""Commands signed by the control plane, checked by agents: an ed25519 key.

Why (issue 35, finding 1): a command subject was bound to no speaker.
Any credential that could read the log (a gateway's, an operator's, the
projector's, the console's) published a command-shaped message on a subject
it may publish, then made a JetStream push consumer deliver it to
`llmgw.cmd.<node>` (nats-server does not check a push consumer's delivery
subject against its creator's permissions). Agents acted on it: a forged
stop stopped live replicas, a forged start ran an engine on 0.0.0.0, and a
forged re-register of term 10**9 made the real agent ignore every genuine
command for ever (the term is kept in its state file). Whatever the server
lets through, an agent now acts only on what the control plane signed.

The key: an nkey seed (ed25519, as NATS' own keys; the `nkeys` package makes
and signs, PyNaCl, its dependency, verifies with the public key alone), made
by the key store (`Keystore.init`) as `<creds>/keys/commands.nk` (0600, the
control plane's alone), its public key written beside the credentials as
`<creds>/commands.pub`, which an operator hands to every node (agent file
`command_key`, `llmgw agent --command-key`). Agents never learn it from the
bus: a key from the bus is the attacker's to choose.

What is signed: `DOMAIN`, the node the command is for, and the command's
bytes exactly as sent, which carry its term and its log's id
(core/folding/commands.py). So a command cannot be replayed to another node, nor
altered, nor moved to another term or log. On the wire a signed command is
the envelope `{"sig":"<base64url>","cmd":<the command's JSON>}`; an unsigned
one (a control plane with no key: a dev NATS without auth) is the command's
JSON alone.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import msgspec

DOMAIN = b"llmgw-command-v1\x00"  # never the bytes of anything else this key could be asked to sign
SEED_FILE = "commands.nk"  # in the key store's keys/ folder
PUBLIC_FILE = "commands.pub"  # in the key store's folder, beside the .creds files
KEY_ENV = "LLMGW_COMMAND_KEY"  # an agent's key (or its file) when no flag or agent file says


def _prefix() -> int:
    import nkeys

    # A "server" nkey (public keys begin with N): not a prefix a NATS user,
    # account or operator key has, so it cannot be mistaken for one.
    return nkeys.PREFIX_BYTE_SERVER


class CommandKeyError(ValueError):
    """A command key that cannot be read: says which and why."""


class Sealed(msgspec.Struct):
    """A signed command on the wire (field order fixed: `sig` first)."""

    sig: str
    cmd: msgspec.Raw


_sealed_decoder = msgspec.json.Decoder(Sealed)
_encoder = msgspec.json.Encoder()


def signed_bytes(node: str, data: bytes) -> bytes:
    """What the signature covers: the domain, the node, the command's bytes (with its term and log)."""
    return DOMAIN + node.encode() + b"\x00" + data


# ----------------------------------------------------------------- the control plane's side


class Signer:
    """The control plane's: signs each command for the node it is sent to."""

    def __init__(self, seed: bytes) -> None:
        import nkeys

        self._kp = nkeys.from_seed(seed)
        self.public_key = self._kp.public_key.decode()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Signer":
        try:
            return cls(Path(path).read_text().strip().encode())
        except OSError as e:
            raise CommandKeyError(f"the command-signing key {path}: {e.strerror or e}") from None
        except Exception as e:  # nkeys' errors: not a seed
            raise CommandKeyError(f"the command-signing key {path} is not an nkey seed ({type(e).__name__})") from None

    def seal(self, node: str, data: bytes) -> bytes:
        sig = base64.urlsafe_b64encode(self._kp.sign(signed_bytes(node, data))).rstrip(b"=").decode()
        return _encoder.encode(Sealed(sig=sig, cmd=msgspec.Raw(data)))


# ----------------------------------------------------------------- an agent's side


class Refused(Exception):
    """A command not to act on; str(e) says why, `kind` names the reason for counting."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind


def _public_bytes(key: str) -> bytes:
    """The 32 bytes of an nkey public key ("N..."), its prefix and checksum checked."""
    import nkeys

    try:
        raw = base64.b32decode(key.encode())
    except (ValueError, base64.binascii.Error):
        raise ValueError("not base32") from None
    if len(raw) != 35:
        raise ValueError("not the length of a public key")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if nkeys.crc16(bytearray(body)) != crc:
        raise ValueError("its checksum does not match")
    if body[0] != _prefix():
        raise ValueError("not a command key (one begins with N)")
    return bytes(body[1:])


class Verifier:
    """An agent's: the public key its operator configured, never one from the bus."""

    def __init__(self, public_key: str, source: str = "") -> None:
        from nacl.signing import VerifyKey

        try:
            self._key = VerifyKey(_public_bytes(public_key.strip()))
        except ValueError as e:
            raise CommandKeyError(f"{source or 'the command key'}: {e}") from None
        self.public_key = public_key.strip()
        self.source = source or "given"

    @classmethod
    def load(cls, given: str) -> "Verifier":
        """From a key ("N...") or a file holding one."""
        text = given.strip()
        if len(text) == 56 and text.startswith("N") and "/" not in text:
            return cls(text, "the command key given")
        try:
            return cls(Path(given).read_text().strip(), str(given))
        except OSError as e:
            raise CommandKeyError(f"the command key {given}: {e.strerror or e}") from None

    def open(self, node: str, data: bytes) -> bytes:
        """The command's bytes if the envelope is signed with our key for `node`; else raises Refused."""
        from nacl.exceptions import BadSignatureError

        if not data.startswith(b'{"sig":'):
            raise Refused("unsigned", "it is not signed")
        try:
            sealed = _sealed_decoder.decode(data)
            sig = base64.urlsafe_b64decode(sealed.sig + "=" * (-len(sealed.sig) % 4))
        except (msgspec.MsgspecError, ValueError) as e:
            raise Refused("malformed", f"its envelope does not decode ({e})") from None
        body = bytes(sealed.cmd)
        try:
            self._key.verify(signed_bytes(node, body), sig)
        except (BadSignatureError, ValueError):
            raise Refused("bad signature", "its signature is not the control plane's for this node") from None
        return body


def unsigned_body(data: bytes) -> bytes:
    """An agent with no key: the command's bytes, from an envelope or not (its signature unchecked)."""
    if data.startswith(b'{"sig":'):
        try:
            return bytes(_sealed_decoder.decode(data).cmd)
        except msgspec.MsgspecError:
            return data  # decoded as a command next, and refused as malformed there
    return data


# ----------------------------------------------------------------- the key's files


def ensure_key(keys_dir: Path, public_dir: Path, mode: int) -> Path:
    """Make the command-signing key (keys_dir/commands.nk, `mode`) unless it is
    there, and (re)write its public key as public_dir/commands.pub. Returns that file."""
    import nkeys

    seed_path = keys_dir / SEED_FILE
    if not seed_path.exists():
        seed = nkeys.encode_seed(os.urandom(32), _prefix())
        tmp = seed_path.with_name(SEED_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(seed + b"\n")
        os.chmod(tmp, mode)
        os.replace(tmp, seed_path)
    public = Signer.from_file(seed_path).public_key
    pub_path = public_dir / PUBLIC_FILE
    if not pub_path.exists() or pub_path.read_text().strip() != public:
        pub_path.write_text(public + "\n")
    return pub_path


def local_files(state_dir: Path | None) -> tuple[Path | None, Path | None]:
    """(seed, public key) of the key store of a local `llmgw up`'s folder, where they exist."""
    if state_dir is None:
        return None, None
    from .auth import DEFAULTS

    creds = state_dir / DEFAULTS.creds_dir
    seed, pub = creds / "keys" / SEED_FILE, creds / PUBLIC_FILE
    return (seed if seed.exists() else None), (pub if pub.exists() else None)


def find_signer(given: str | None, *, state_dir: Path | None) -> Signer | None:
    """The control plane's key: --signing-key, else the local `llmgw up`'s key store's; None: none."""
    if given:
        return Signer.from_file(given)
    seed, _ = local_files(state_dir)
    return Signer.from_file(seed) if seed is not None else None


def find_verifier(given: str | None, from_agent_file: str = "", *, state_dir: Path | None) -> Verifier | None:
    """An agent's key, as its credential is found: --command-key, else its agent
    file's `command_key`, else $LLMGW_COMMAND_KEY, else the public key of the
    local `llmgw up`'s key store. None: none configured (it acts on unsigned commands)."""
    for source in (given, from_agent_file, os.environ.get(KEY_ENV)):
        if source:
            return Verifier.load(source)
    _, pub = local_files(state_dir)
    return Verifier.load(str(pub)) if pub is not None else None
