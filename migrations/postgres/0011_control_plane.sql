-- The control plane's identity: a short random id made once for this ledger (and so shared by
-- every daemon of an HA pair), which every host object its agents make names, so that two
-- control planes on one machine never take each other's containers, networks or tables.
CREATE TABLE control_plane (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id TEXT NOT NULL
);
-- The /24s of the subnet pool that others' networks use on each node's machine (another
-- control plane's, or any network not Pushleft's), as the node's agent last reported them:
-- comma-separated indices in the pool. Subnets are chosen around them.
ALTER TABLE nodes ADD COLUMN taken_subnets TEXT NOT NULL DEFAULT '';
