"""The gateway: the OpenAI API in front of the fleet, as many as needed, stateless.

Its routing table is a fold over the same log as the control plane's state
(ready replicas, their endpoints and weights, the catalog's names, aliases
and API keys), updated live as the log grows; the rules are pure and tested
without I/O, the shell around them is thin:

    routing.py   the table from the folded state; least outstanding requests
                 weighted per replica; a breaker per endpoint        (pure)
    limits.py    per-key requests and tokens per minute              (pure)
    load.py      load and usage per model, coalesced into reports    (pure)
    metrics.py   counters and histograms, Prometheus' text format     (pure)
    api.py       OpenAI's shapes: errors, the model list, usage       (pure)
    edge_limits.py  against one client: JSON depth, connections per
                 address, wrong keys per address                     (pure)
    upstream.py  pooled keep-alive HTTP/1.1 connections to the engines (shell)
    config.py    addresses, the HTTP edge's limits, timeouts: one object with named defaults
    connection.py  one client connection: parsed, limited, answered  (shell)
    exchange.py  one attempt at one replica, passed back as it comes  (shell)
    edge.py      the HTTP edge: listening, admission, the gateway's own replies  (shell)
    proxying.py  a replica chosen, attempts, retries, the breakers' outcomes  (shell)
    table_upkeep.py  the log folded into the routing table, backends and pools  (shell)
    prefix.py    a prompt's blocks, the bounded index of who holds them  (pure)
    choose.py    which replica, by the model's routing policy, and why  (pure)
    hints.py     where prompts went, told to and heard from the other gateways  (pure)
    server.py    the gateway put together: started, load reported, closed  (shell)

The APIs served by translation onto the engines' chat completions (issue 31):

    chat_answer.py    a chat answer (whole or streamed) read into its facts  (pure)
    responses_api.py  OpenAI's Responses API <-> chat completions             (pure)
    anthropic_api.py  Anthropic's Messages API <-> chat completions           (pure)
    stored.py    stored responses in NATS KV, owner-scoped, bounded      (shell)
    translated.py  their requests onto the chat path, answers rewritten at the
                 client's transport                                  (shell)
"""
