-- Cache-aware routing (issue 30): a model's routing policy and where the
-- gateways sent its requests, and why, per replica (Model.routed), for
-- `ctl describe model`.
ALTER TABLE models ADD COLUMN routing TEXT NOT NULL DEFAULT '{}';
