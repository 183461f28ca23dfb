"""The one exception of the fold: an event that breaks a rule of the fold is
quarantined, not applied. A module of its own so that the rules whose
handlers the fold calls (facility, admission) can raise it without
importing the fold, which imports them."""


class Refused(ValueError):
    """The event breaks a rule of the fold; it is quarantined, not applied."""
