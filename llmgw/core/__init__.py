"""The pure core of llmgw: the event contract, the fold and its decisions.

Nothing here does I/O, reads a clock, draws a random number or awaits: the
same log always folds to the same state and the same decisions. The shell
(`llmgw.bus`, `llmgw.control`, `llmgw.agent`, the CLI) does all the waiting.
`tests/test_architecture.py` enforces that this package imports nothing else.
"""
