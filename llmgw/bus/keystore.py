"""The key store (`Keystore`): the operator's and accounts' keys and every
credential issued, in one folder (its layout: bus/auth.py's docstring);
credentials issued and revoked, and the nats-server configuration written
from them. And which credential a component connects with: --creds,
$LLMGW_CREDS, else one from the local `llmgw up`'s key store."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import accounts, signing
from .auth import CREDS_ENV, DEFAULTS, SINGLE, TAG_NAME, TAG_ROLE, AuthConfig, CredentialError
from .credentials import _new_key, _write_private, creds_text, encode_jwt, identity
from .roles import Permissions, check_name, commands_permissions, permissions


@dataclass
class Issued:
    role: str
    name: str
    public_key: str
    file: str
    issued_at: float
    revoked_at: float = 0.0
    account: str = accounts.LLMGW  # whose key signed it (bus/accounts.py); rows before the split: llmgw

    @property
    def revoked(self) -> bool:
        return self.revoked_at > 0


@dataclass
class Keystore:
    """The operator's and account's keys and every credential issued, in one folder."""

    folder: Path
    config: AuthConfig = field(default_factory=AuthConfig)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)

    # -- files

    @property
    def keys_dir(self) -> Path:
        return self.folder / "keys"

    @property
    def registry_path(self) -> Path:
        return self.folder / "issued.json"

    @property
    def server_conf_path(self) -> Path:
        return self.folder / "server-auth.conf"

    def exists(self) -> bool:
        return (self.keys_dir / "account.nk").exists()

    def _seed(self, which: str, create) -> "object":
        import nkeys

        path = self.keys_dir / f"{which}.nk"
        if not path.exists():
            kp = create()
            _write_private(path, kp.seed.decode() + "\n", self.config.file_mode)
        return nkeys.from_seed(path.read_text().strip().encode())

    def init(self) -> "Keystore":
        """Make the keys and the server's configuration, or keep those there (idempotent)."""
        import nkeys

        def create_operator_pair():
            return _new_key(nkeys.PREFIX_BYTE_OPERATOR)

        def create_account_pair():
            return _new_key(nkeys.PREFIX_BYTE_ACCOUNT)

        self.folder.mkdir(parents=True, exist_ok=True)
        self.keys_dir.mkdir(exist_ok=True)
        os.chmod(self.folder, self.config.dir_mode)
        os.chmod(self.keys_dir, self.config.dir_mode)
        self._seed("operator", create_operator_pair)
        self._seed("system", create_account_pair)
        self._seed("account", create_account_pair)
        self._seed("nodes", create_account_pair)
        self._seed("readers", create_account_pair)
        # The control plane's command-signing key, its public key beside the credentials (bus/signing.py).
        signing.ensure_key(self.keys_dir, self.folder, self.config.file_mode)
        self.write_server_conf()
        return self

    def _require(self) -> None:
        if not self.exists():
            raise CredentialError(f"no llmgw keys in {self.folder}: `llmgw up` makes them (or `llmgw creds init`)")

    def account_public_key(self) -> str:
        self._require()
        return self._seed("account", None).public_key.decode()

    # -- JWTs

    def _operator_jwt(self, okp, system_pub: str) -> str:
        nats = {"type": "operator", "version": 2, "system_account": system_pub}
        return encode_jwt({"sub": okp.public_key.decode(), "name": self.config.operator_name, "nats": nats}, okp)

    def _account_jwt(self, okp, akp, name: str, *, jetstream: bool, revocations: dict[str, int], crossings: dict | None = None) -> str:
        limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1}
        if jetstream:
            limits.update(mem_storage=-1, disk_storage=-1, streams=-1, consumer=self.config.max_consumers)
        nats: dict = {"type": "account", "version": 2, "limits": limits, **(crossings or {})}
        if revocations:
            # A user JWT issued at or before its key's time here is refused.
            nats["revocations"] = dict(sorted(revocations.items()))
        return encode_jwt({"sub": akp.public_key.decode(), "name": name, "nats": nats}, okp)

    def _kept(self, file: str, make) -> str:
        path = self.keys_dir / file
        if not path.exists():
            _write_private(path, make() + "\n", self.config.file_mode)
        return path.read_text().strip()

    def server_conf(self) -> str:
        """The part of nats-server's configuration that turns auth on."""
        import nkeys

        self._require()
        okp = self._seed("operator", None)
        skp = self._seed("system", None)
        akp = self._seed("account", None)
        # (made here for a store from before the split)
        nkp = self._seed("nodes", lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        rkp = self._seed("readers", lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        revoked: dict[str, dict[str, int]] = {accounts.LLMGW: {}, accounts.NODES: {}, accounts.READERS: {}}
        for i in self.issued():
            if i.revoked:
                revoked.setdefault(i.account, {})[i.public_key] = int(i.revoked_at) + 1
        sys_pub, acc_pub, nodes_pub, readers_pub = (k.public_key.decode() for k in (skp, akp, nkp, rkp))
        # Signed once and kept: nats-server reloads no change to its trusted
        # operator, and only the account's JWT (its revocations) ever changes.
        operator = self._kept("operator.jwt", lambda: self._operator_jwt(okp, sys_pub))
        system = self._kept(
            "system.jwt", lambda: self._account_jwt(okp, skp, self.config.system_account_name, jetstream=False, revocations={})
        )
        account = self._account_jwt(
            okp, akp, self.config.account_name, jetstream=True, revocations=revoked[accounts.LLMGW],
            crossings=accounts.llmgw_crossings(nodes_pub),
        )  # fmt: skip
        # No JetStream in NODES: none of its users can ask the server to deliver anything.
        nodes = self._account_jwt(
            okp, nkp, self.config.nodes_account_name, jetstream=False, revocations=revoked[accounts.NODES],
            crossings=accounts.nodes_crossings(acc_pub),
        )  # fmt: skip
        # Nor in READERS: the server's answers to a reader's requests land
        # there, where no stream captures them (bus/accounts.py).
        readers = self._account_jwt(
            okp, rkp, self.config.readers_account_name, jetstream=False, revocations=revoked[accounts.READERS],
            crossings=accounts.readers_crossings(acc_pub, nodes_pub),
        )  # fmt: skip
        return (
            "# Written by llmgw (llmgw/bus/auth.py): decentralized JWT auth.\n"
            "# No anonymous connections: every client presents a user JWT of the\n"
            f"# {self.config.account_name} account, or of {self.config.nodes_account_name} (agents: bus/accounts.py),\n"
            "# whose permissions the server enforces.\n"
            f'operator: "{operator}"\n'
            f"system_account: {sys_pub}\n"
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  {sys_pub}: "{system}"\n'
            f'  {acc_pub}: "{account}"\n'
            f'  {nodes_pub}: "{nodes}"\n'
            f'  {readers_pub}: "{readers}"\n'
            "}\n"
        )

    def write_server_conf(self) -> Path:
        _write_private(self.server_conf_path, self.server_conf(), self.config.file_mode)
        return self.server_conf_path

    # -- credentials

    def issued(self) -> list[Issued]:
        try:
            rows = json.loads(self.registry_path.read_text())
        except FileNotFoundError:
            return []
        except ValueError as e:
            raise CredentialError(f"{self.registry_path} is damaged: {e}") from None
        return [Issued(**r) for r in rows]

    def _save(self, rows: list[Issued]) -> None:
        _write_private(self.registry_path, json.dumps([r.__dict__ for r in rows], indent=1) + "\n", self.config.file_mode)

    def file_for(self, role: str, name: str) -> Path:
        if role == "operator" and name == self.config.local_operator:
            return self.folder / "operator.creds"
        if SINGLE.get(role) == name:
            return self.folder / f"{role}.creds"
        return self.folder / f"{role}-{name}.creds"

    def _locked(self):
        """One writer of the store at a time (components started together each issue theirs)."""
        import contextlib
        import fcntl

        @contextlib.contextmanager
        def hold():
            fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, self.config.file_mode)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

        return hold()

    def issue(self, role: str, name: str | None = None, *, out: Path | None = None) -> Path:
        """A new credential (a new key: an old one of that name stays valid until revoked)."""
        self._require()
        with self._locked():
            return self._issue(role, name, out=out)

    def _issue(self, role: str, name: str | None = None, *, out: Path | None = None) -> Path:
        import nkeys

        self._require()
        name = name or SINGLE.get(role) or (self.config.local_operator if role == "operator" else "")
        perms = permissions(role, name)  # checks role and name
        path = Path(out) if out else self.file_for(role, name)
        account = accounts.account_of(role)
        rows = self.issued()
        rows.append(self._user(role, name, perms, account, path))
        if role == "control":  # its second credential, in NODES: commands
            rows.append(self._user(role, name, commands_permissions(name), accounts.NODES, accounts.commands_creds_path(path)))
        self._save(rows)
        return path

    def _user(self, role: str, name: str, perms: Permissions, account: str, path: Path) -> Issued:
        """A user of `account` (signed by its key) with those permissions, written to `path`."""
        import nkeys

        key = {accounts.NODES: "nodes", accounts.READERS: "readers"}.get(account, "account")
        akp = self._seed(key, lambda: _new_key(nkeys.PREFIX_BYTE_ACCOUNT))
        ukp = _new_key(nkeys.PREFIX_BYTE_USER)
        pub: dict = {"allow": list(perms.pub_allow)}
        if perms.pub_deny:
            pub["deny"] = list(perms.pub_deny)
        nats: dict = {
            "type": "user", "version": 2, "pub": pub, "sub": {"allow": list(perms.sub_allow)},
            "subs": -1, "data": -1, "payload": self.config.max_payload(role),
            "tags": [f"{TAG_ROLE}{role}", f"{TAG_NAME}{name}"],
        }  # fmt: skip
        if perms.responses:
            nats["resp"] = {"max": self.config.max_responses, "ttl": 0}
        token = encode_jwt({"sub": ukp.public_key.decode(), "name": f"llmgw-{role}-{name}", "nats": nats}, akp)
        _write_private(path, creds_text(token, ukp.seed.decode()), self.config.file_mode)
        return Issued(role=role, name=name, public_key=ukp.public_key.decode(), file=str(path.resolve()), issued_at=time.time(), account=account)

    def issue_unrestricted(self, path: Path) -> Path:
        """A credential that may publish and read anything: for a test harness
        or a benchmark that loads a recorded log (every speaker's events at
        once). It has no llmgw role, so no component accepts it as its own;
        never give one to a component, and keep it out of a fleet. Beside it,
        the same in NODES (accounts.commands_creds_path): a bus connected
        with it sends commands there, as a control plane does."""
        import nkeys

        self._require()
        for key, out in (("account", Path(path)), ("nodes", accounts.commands_creds_path(path))):
            user = _new_key(nkeys.PREFIX_BYTE_USER)
            nats = {"type": "user", "version": 2, "pub": {"allow": [">"]}, "sub": {"allow": [">"]}, "subs": -1, "data": -1, "payload": -1}
            token = encode_jwt({"sub": user.public_key.decode(), "name": "llmgw-unrestricted", "nats": nats}, self._seed(key, None))
            _write_private(out, creds_text(token, user.seed.decode()), self.config.file_mode)
        return Path(path)

    def ensure(self, role: str, name: str | None = None) -> Path:
        """The credential of that role and name in this store, issued if there is none usable."""
        name = name or SINGLE.get(role) or (self.config.local_operator if role == "operator" else "")
        self._require()
        with self._locked():
            return self._ensure(role, name)

    def _ensure(self, role: str, name: str) -> Path:
        path = self.file_for(role, name)
        # Each file present, live, and of its role's account (one issued
        # before the accounts were split is issued again).
        wanted = [(path, accounts.account_of(role))]
        if role == "control":
            wanted.append((accounts.commands_creds_path(path), accounts.NODES))
        live = {(i.public_key, i.account) for i in self.issued() if not i.revoked}
        if all(self._holds(p, account, live) for p, account in wanted):
            return path
        return self._issue(role, name)

    @staticmethod
    def _holds(path: Path, account: str, live: set) -> bool:
        try:
            return path.exists() and (identity(path).public_key, account) in live
        except CredentialError:
            return False

    def revoke(self, role: str, name: str) -> list[Issued]:
        """Revoke every live credential of that role and name; returns them.
        The server learns it when it reloads the configuration (`reload_server`)."""
        check_name(role, name)
        self._require()
        with self._locked():
            return self._revoke(role, name)

    def _revoke(self, role: str, name: str) -> list[Issued]:
        rows = self.issued()
        hit = [r for r in rows if r.role == role and r.name == name and not r.revoked]
        if not hit:
            raise CredentialError(f"no live credential for {role} {name} in {self.folder}")
        now = time.time()
        for r in hit:
            r.revoked_at = now
        self._save(rows)
        self.write_server_conf()
        for r in hit:
            Path(r.file).unlink(missing_ok=True)
        return hit


def reload_server(pid_file: Path) -> bool:
    """Ask a local nats-server to read its configuration again (SIGHUP): how it
    learns a revocation. False when no server runs from that pid file."""
    import signal

    try:
        pid = int(Path(pid_file).read_text().strip())
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError):
        return False
    return True


# ----------------------------------------------------------------- finding one's credential


def find_creds(given: str | None, *, state_dir: Path | None) -> Path | None:
    """--creds, else $LLMGW_CREDS, else the local `llmgw up`'s tools' credential."""
    if given:
        return Path(given)
    env = os.environ.get(CREDS_ENV)
    if env:
        return Path(env)
    if state_dir is not None:
        local = state_dir / DEFAULTS.creds_dir / "operator.creds"
        if local.exists():
            return local
    return None


def speaker(creds: str | os.PathLike | None, role: str, name: str | None) -> str | None:
    """The name a component speaks as: `name` if given, else its credential's;
    a credential of another role or name is an error that says so."""
    if creds is None:
        return name
    who = identity(creds)
    if who.role != role:
        raise CredentialError(f"{creds} is the credential of {who.role} {who.name}, not of a {role}")
    if name and name != who.name:
        raise CredentialError(
            f"{creds} is the credential of {role} {who.name}, not of {name}: give that one's (`llmgw creds issue {role} {name}`)"
        )
    return who.name


def component_creds(given: str | None, role: str, name: str | None, *, state_dir: Path | None) -> tuple[Path | None, str | None]:
    """(credential, name) a component connects with.

    `--creds` (or $LLMGW_CREDS) when given: its name is the credential's, and
    a `name` that differs is an error. Else, in a folder of a local `llmgw up`
    (its key store under `<state dir>/creds`), the credential of that role and
    name from there, issued on first use: on one machine no one has to think
    about credentials. Else none (a server without auth)."""
    explicit = given or os.environ.get(CREDS_ENV)
    if explicit:
        return Path(explicit), speaker(explicit, role, name)
    if state_dir is not None and name:
        keys = Keystore(state_dir / DEFAULTS.creds_dir)
        if keys.exists():
            return keys.ensure(role, name), name
    return None, name
