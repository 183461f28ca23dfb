-- A replica's restart state and its reason are separate fields (issue 11):
-- `restart` is one of '', 'queued', 'replacing', 'in place', 'refused';
-- `restart_reason` says why it restarts, or why it was refused.
ALTER TABLE replicas ADD COLUMN restart_reason TEXT NOT NULL DEFAULT '';
