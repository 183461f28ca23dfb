"""The rules of decide: one module per concern (admission, adoption, restarts, preemption,
scaling, quotas, drains, waits), and the pass that runs them."""
