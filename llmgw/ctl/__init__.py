"""The operator's side, shared by the CLI (llmgw/cli/), the console and
replay: reading a catalog file and publishing what changed, the read models
read and shown, the exit statuses. It imports nothing from llmgw/cli/."""
