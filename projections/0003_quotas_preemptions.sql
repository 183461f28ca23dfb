-- Quotas and preemption (issue 5).

-- Each owner the catalog names or replicas run for: what it is guaranteed,
-- the most it may hold, what it holds and how much of that is borrowed
-- (held past its guarantee), as llmgw.core.rules.quota.report says. JSON objects
-- {"gpus", "cpu_cores", "memory_gb"}; in `limits` a null is no limit.
CREATE TABLE quotas (
    owner         TEXT PRIMARY KEY,
    guarantee     TEXT NOT NULL,
    limits        TEXT NOT NULL,
    usage         TEXT NOT NULL,
    borrowed      TEXT NOT NULL
);

-- One row per preemption decided: who needed room, whom it took (JSON list
-- of {"replica", "model", "priority", "tier", "why", "idle_s", "gpus"}),
-- why, and what the nodes involved had free before. voided: why the fold
-- refused it ('' when it took effect).
CREATE TABLE preemptions (
    seq           INTEGER NOT NULL,
    idx           INTEGER NOT NULL,
    at            REAL NOT NULL,
    model         TEXT NOT NULL,
    victims       TEXT NOT NULL,
    reason        TEXT NOT NULL,
    inventory     TEXT NOT NULL,
    voided        TEXT NOT NULL,
    PRIMARY KEY (seq, idx)
) WITHOUT ROWID;
