"""Node agents.

The real one (`llmgw agent`: `node.py`) runs this node's inference engines,
one module per job: the agent file (`agentfile.py`), the inventory from NVML
or that file (`inventory.py`), the weights a profile names (`weights.py`),
each engine kind's command line (`engines.py`; llama.cpp runs
`llamacpp_server.py`), processes and health (`supervisor.py`, each engine
under `runner.py`), what survives an agent restart (`statefile.py`) and the
engines' logs (`logs.py`). The simulated one (`simulated.py`) speaks the same
protocol and runs nothing: the fleet simulator for tests and benchmarks.
"""
