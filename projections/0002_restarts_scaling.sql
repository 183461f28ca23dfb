-- The reconciler's own state per model and replica (issue 4): how many
-- replicas a model should run now and why it is parked, and where each
-- replica's restart stands.

-- The count last decided (a ScaleModel decision), or min_replicas when none was.
ALTER TABLE models ADD COLUMN desired INTEGER NOT NULL DEFAULT 0;
-- Why the model is placed no more after replicas kept failing to start
-- ('' when it is not); `llmgw ctl retry NAME` unparks it.
ALTER TABLE models ADD COLUMN parked TEXT NOT NULL DEFAULT '';

-- '' (none) | queued | replacing | in place | refused: why
ALTER TABLE replicas ADD COLUMN restart TEXT NOT NULL DEFAULT '';
