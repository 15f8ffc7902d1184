-- The machine each node's agent reports it runs on (its machine id). Nodes that share a machine
-- share its Docker engine and kernel, so their environments get subnets that do not overlap.
ALTER TABLE nodes ADD COLUMN host TEXT;
