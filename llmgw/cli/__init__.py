"""The `llmgw` command: argument parsing and wiring, no policy."""
