-- The facility (issue 14): where each node is (its effective location
-- labels, kind -> name) and what it is counted as drawing; the facility's
-- refusals a replica's placement met; and one row per facility domain
-- (core/scheduling/facility.py domain_rows), for `ctl facility` and the console.
ALTER TABLE nodes ADD COLUMN location TEXT NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN power_w REAL NOT NULL DEFAULT 0;
ALTER TABLE replicas ADD COLUMN rejections TEXT NOT NULL DEFAULT '[]';
CREATE TABLE domains (
    domain TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    nodes INTEGER NOT NULL,
    gpus_used INTEGER NOT NULL,
    gpus_free INTEGER NOT NULL,
    draw_w REAL NOT NULL,
    cap_w REAL NOT NULL,
    held INTEGER NOT NULL,
    drain INTEGER NOT NULL,
    hold_reason TEXT NOT NULL,
    held_at REAL NOT NULL
);
