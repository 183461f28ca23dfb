"""The base of every record and event of the contract (events/__init__.py
says the rules they keep): a record is a plain struct; an event carries its
tag (`type`), the schema version (`v`) and when it was published (`at`)."""

from __future__ import annotations

import msgspec

from .. import bounds as b


SCHEMA_VERSION = 1


class Struct(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """Base of every plain record in the contract (not itself an event)."""


class Event(msgspec.Struct, kw_only=True, tag_field="type", gc=False):
    """Base of every event; subclasses set an explicit string tag."""

    v: b.Version = SCHEMA_VERSION
    at: b.Time
