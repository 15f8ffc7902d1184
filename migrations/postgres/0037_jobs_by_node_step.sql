-- A node's jobs of one rollout, by step: what a set-up's success releases (its node's held
-- replicas of the later steps, once no earlier step's job there is unfinished) is found in a
-- few index entries, where `jobs_by_step` read every job of the environment's later and earlier
-- steps for each set-up (6 ms a statement of 128 set-ups at 3,000 nodes, the group commit's
-- costliest). Only inserts maintain it: a lease or a completion changes none of its columns.
CREATE INDEX jobs_by_node_step ON jobs (environment, generation, target_node, step);
