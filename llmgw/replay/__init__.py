"""`llmgw replay`: fold the log (live, or from a file) and look at any moment of it."""
