"""Placement with the facility: where a replica fits (fit), the search over nodes, the facility's
locations and power caps, fabrics and ports, and why nothing fits."""
