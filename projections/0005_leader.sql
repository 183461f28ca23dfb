-- Who decided (issue 13): the control plane that led when each decision was
-- taken (Decided.leader; for a node lost, the leader of the log then), and
-- a decision of kind 'leader' for each term a leader began (leader.elected).
ALTER TABLE decisions ADD COLUMN leader TEXT NOT NULL DEFAULT '';
