-- The read models: what the CLI and people query, projected from the log by
-- llmgw.projections. Every row here can be thrown away and derived again from
-- the log (`llmgw.projections.rebuild`); the log is the truth.
--
-- Two kinds of tables:
--   * entity tables (models, nodes, replicas, shards): the folded state as of
--     projection_position.seq, one row per thing that exists now; a row goes
--     when its thing leaves the state.
--   * history tables (events, event_mentions, decisions, quarantined): append
--     only, one row per event (or per action), keyed by stream sequence.
-- JSON columns hold msgspec-encoded JSON text (query them with json_each).
-- Times are the event's own `at` (Unix seconds), never a clock of the projector,
-- so projecting the same log twice gives the same rows.

CREATE TABLE models (
    name          TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    min_replicas  INTEGER NOT NULL,
    max_replicas  INTEGER NOT NULL,          -- the most it may run (llmgw.core.contract.catalog.max_replicas: never below min)
    aliases       TEXT NOT NULL,             -- JSON list of names
    profiles      TEXT NOT NULL,             -- JSON list of profile specs in order of preference, each with its "fingerprint"
    waiting       TEXT NOT NULL,             -- why it has fewer replicas than it wants; '' when it has them
    applied_at    REAL NOT NULL
);

CREATE TABLE nodes (
    name          TEXT PRIMARY KEY,
    state         TEXT NOT NULL,             -- ready | lost
    reason        TEXT NOT NULL,
    gpus_total    INTEGER NOT NULL,
    gpus_used     INTEGER NOT NULL,
    gpus          TEXT NOT NULL,             -- JSON [{"index", "model", "memory_gb", "shard"}]; shard: who holds it, '' when free
    labels        TEXT NOT NULL,             -- JSON object
    memory_gb     REAL NOT NULL,
    cpu_cores     INTEGER NOT NULL,
    agent         TEXT NOT NULL,
    strays        TEXT NOT NULL,             -- JSON {shard: {"generation", "gpus", "port", "reason", "stopping"}}
    registered_at REAL NOT NULL
);

CREATE TABLE replicas (
    id            TEXT PRIMARY KEY,
    model         TEXT NOT NULL,
    profile       TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    state         TEXT NOT NULL,             -- placing | starting | loading | ready | stopping | failed
    reason        TEXT NOT NULL,
    placed_at     REAL NOT NULL,
    ready_at      REAL NOT NULL,             -- 0 until ready
    stopping_at   REAL NOT NULL              -- 0 unless stopping
);
CREATE INDEX replicas_by_model ON replicas (model);

CREATE TABLE shards (
    id            TEXT PRIMARY KEY,
    replica       TEXT NOT NULL,
    node          TEXT NOT NULL,
    rank          INTEGER NOT NULL,
    gpus          TEXT NOT NULL,             -- JSON list of GPU indexes on its node
    port          INTEGER NOT NULL,
    generation    INTEGER NOT NULL,
    state         TEXT NOT NULL,
    reason        TEXT NOT NULL,
    endpoint      TEXT NOT NULL
);
CREATE INDEX shards_by_replica ON shards (replica);
CREATE INDEX shards_by_node ON shards (node);

-- One row per action of every control.decided event, and one per node.lost.
-- kind: place | stop | wait | stop-stray | node-lost. node: the nodes the
-- action concerns, comma-separated in rank order (a replica may span nodes).
-- voided: why the fold refused the action when it reached the log ('' when
-- it took effect). The action in words is in its event's summary. Found by
-- thing through event_mentions (see below), so no index of its own is kept
-- up on every write.
CREATE TABLE decisions (
    seq           INTEGER NOT NULL,
    idx           INTEGER NOT NULL,          -- the action's place in its event
    at            REAL NOT NULL,
    kind          TEXT NOT NULL,
    model         TEXT NOT NULL,
    replica       TEXT NOT NULL,
    node          TEXT NOT NULL,
    reason        TEXT NOT NULL,
    voided        TEXT NOT NULL,
    PRIMARY KEY (seq, idx)
) WITHOUT ROWID;

-- Every message of the log, in a line (llmgw.core.simulation.history.summary). type is
-- the event's tag, or what a message that is not an event says it is ('' if
-- nothing).
CREATE TABLE events (
    seq           INTEGER PRIMARY KEY,
    at            REAL,                      -- NULL when the message could not be decoded
    type          TEXT NOT NULL,
    subject       TEXT NOT NULL,
    summary       TEXT NOT NULL
);

-- Every model, replica and node the log ever mentioned, numbered in order of
-- first mention (so the same log always numbers them alike).
CREATE TABLE entities (
    id            INTEGER PRIMARY KEY,
    kind          TEXT NOT NULL,             -- model | replica | node
    name          TEXT NOT NULL,
    UNIQUE (kind, name)
);

-- What each event is about (llmgw.core.simulation.history.mentions): the index behind
-- `describe model|replica|node NAME`:
--   SELECT e.* FROM entities x JOIN event_mentions m ON m.entity = x.id
--     JOIN events e ON e.seq = m.seq WHERE x.kind = ? AND x.name = ? ORDER BY e.seq
-- (and JOIN decisions d ON d.seq = m.seq for its decisions). Integer keys:
-- this is most of what the projector writes, ~4 rows per event, and
-- (entity, seq) pairs are half the work of (kind, name, seq) ones.
CREATE TABLE event_mentions (
    entity        INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    PRIMARY KEY (entity, seq)
) WITHOUT ROWID;

CREATE TABLE quarantined (
    seq           INTEGER PRIMARY KEY,
    subject       TEXT NOT NULL,
    error         TEXT NOT NULL
);

-- How far the rows above are: written in the same transaction as the rows,
-- so they never disagree. log_id and fold_version say which log and which
-- fold the rows were made with; another one asks for a rebuild.
CREATE TABLE projection_position (
    name          TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,
    log_id        TEXT NOT NULL,
    fold_version  INTEGER NOT NULL
);
