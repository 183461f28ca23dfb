"""The event contract: the events, their bounds, the fleet policy, and the rules of the catalog and
of tenancy that every reader of the log shares."""
