"""Simulation: replay decided again (redecide), what-if under a changed policy, the history of an
entity and the figures of a run."""
