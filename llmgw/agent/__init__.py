"""Node agents: the simulated one (a fleet simulator for tests and
benchmarks); the real one, which runs inference engines, is its own issue."""
