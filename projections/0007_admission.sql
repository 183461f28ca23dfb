-- Node admission (issue 35, core/rules/admission.py): the labels a node claims
-- for itself that placement does not count (its own pool, until an operator
-- sets it), for `ctl describe node` and `ctl node admit`.
ALTER TABLE nodes ADD COLUMN unadmitted TEXT NOT NULL DEFAULT '{}';
