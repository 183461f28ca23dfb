"""The web console: the fleet at a glance, any moment of its history, and the
operator's actions, served by `llmgw console` (and `llmgw up`). Plain HTML,
CSS and JavaScript under static/, shipped in the package: nothing to build."""
