"""What an operator says (`llmgw ctl`, on `llmgw.ctl.>`): the catalog,
owners and keys, restarts and retries, labels and admission, the facility,
the policy."""

from __future__ import annotations

import msgspec

from .. import bounds as b
from ..policy import Policy
from .base import Event
from .records import Limit, ModelSpec, Resources


class ModelApplied(Event, tag="model.applied"):
    model: ModelSpec


class ModelRemoved(Event, tag="model.removed"):
    name: b.ModelRef


class ReplicasRestart(Event, tag="replicas.restart"):
    """An operator asks for replicas to be replaced (`llmgw ctl restart`).

    Each is replaced beside itself (surge) unless `in_place`: stopped first,
    its replacement started in what it frees. `max_surge` and
    `max_unavailable` pace a model's restarts (0 and 0: one at a time)."""

    replicas: b.ReplicaIds
    in_place: bool = False
    max_surge: b.ReplicaCount = 0
    max_unavailable: b.ReplicaCount = 0


class ModelRetry(Event, tag="model.retry"):
    """An operator unparks a model whose replicas kept failing to start."""

    name: b.ModelRef


class OwnerApplied(Event, tag="owner.applied"):
    """An owner of models (an organisation, a team: "org/team" is a team of
    org), with what it is guaranteed and the most it may hold. Usage counts
    up the tree: a team's replicas count for its organisation too."""

    name: b.OwnerPath
    guarantee: Resources = msgspec.field(default_factory=Resources)
    limit: Limit = msgspec.field(default_factory=Limit)
    # What its keys may ask of the gateways together, counted up the tree (a
    # team's requests count for its organisation too); 0: no limit
    # (gateway/quota.py).
    requests_per_minute: b.Counter = 0
    tokens_per_minute: b.Counter = 0
    tokens_per_day: b.Counter = 0
    tokens_per_month: b.Counter = 0
    spend_per_day: b.Price = 0.0  # in the catalog's currency, at its models' prices
    spend_per_month: b.Price = 0.0


class OwnerRemoved(Event, tag="owner.removed"):
    name: b.OwnerName


class ApiKeyApplied(Event, tag="apikey.applied"):
    """A key of the gateway, for one owner. Only its SHA-256 travels and is
    kept: the key itself is never in the log."""

    name: b.KeyName
    owner: b.OwnerName
    key_sha256: b.KeySha256
    requests_per_minute: b.Counter = 0  # 0: no limit
    tokens_per_minute: b.Counter = 0
    tokens_per_day: b.Counter = 0  # a budget per UTC day (gateway/quota.py)
    tokens_per_month: b.Counter = 0  # a budget per UTC calendar month
    spend_per_day: b.Price = 0.0  # budgets in the catalog's currency, at its models' prices
    spend_per_month: b.Price = 0.0


class ApiKeyRemoved(Event, tag="apikey.removed"):
    name: b.KeyName


class CredentialRevoked(Event, tag="credential.revoked"):
    """An operator revoked a bus credential (`llmgw creds revoke`): the NATS
    server refuses it from then on. A node whose agent's credential it was is
    treated as lost, until it registers again (with a new credential)."""

    role: b.Role  # agent, gateway, operator, control, projector
    name: b.NodeName  # the node, gateway or operator it was issued for
    public_key: b.PublicKey = ""


class NodeLabeled(Event, tag="node.labeled"):
    """An operator set or removed location labels of a node (`llmgw ctl label
    NODE rack=r4-12 pdu=pdu-a`, `rack-` to remove). Labels set this way win
    over the agent's own (from its agent file) until removed, when the
    agent's show again. Keys are short kinds (site, room, row, rack, pdu) or
    whole label names; the fold keeps whole names (llmgw.io/rack)."""

    node: b.NodeRef
    set: b.Labels = {}
    remove: b.LabelKeys = []


class NodeAdmitted(Event, tag="node.admitted"):
    """An operator admitted a node (`llmgw ctl node admit NODE`): what it
    claimed of itself is granted, as it claimed it then. Its pool becomes
    the operator's (as `ctl label NODE pool=` sets it); its GPUs (how many,
    of which models) are what it may claim from then on under the policy
    `admission: manual`, where a node is placed on only once admitted and
    only while it claims no more than that (core/rules/admission.py)."""

    node: b.NodeRef
    gpus: b.GpuCount = 0
    gpu_models: b.many(b.GpuModel, b.MAX_GPUS_PER_NODE) = []
    pool: b.LabelValue = ""


class DomainHeld(Event, tag="domain.held"):
    """An operator held a facility domain (`llmgw ctl facility hold rack/r4-12`):
    nothing new is placed in it; with `drain`, its replicas are replaced
    elsewhere first and then stopped."""

    domain: b.Domain  # KIND/NAME, KIND one of site, room, row, rack, pdu
    drain: bool = False
    reason: b.Text = ""


class DomainReleased(Event, tag="domain.released"):
    """An operator released a held domain: placement may use it again."""

    domain: b.Domain


class FacilityApplied(Event, tag="facility.applied"):
    """The catalog's `facility:` section, whole each time: the power cap in
    watts of each domain that has one (a domain not named has none)."""

    budgets: b.Budgets = {}


class PolicyApplied(Event, tag="policy.applied"):
    """The catalog's `policy:` section, whole each time: the fleet-wide
    numbers the rules decide with (core/contract/policy.py; a field not given has
    its default)."""

    policy: Policy = msgspec.field(default_factory=Policy)
