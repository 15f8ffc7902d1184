-- `deployment_uses.canary` (0024) was written with every spec and read by nothing: a
-- deployment's canary shows from its typed step columns (`step_state`, `share`, 0025), not
-- from what its spec uses. Dropped, so no column claims a reader it does not have.
ALTER TABLE deployment_uses DROP COLUMN canary;
