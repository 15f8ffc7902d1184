-- The task set the node's agent runs (agent_proto::PROTOCOL, from its heartbeats; 0: an agent
-- that predates ensure-environment, whose environments' set-ups are queued as the network,
-- firewall and routes tasks it knows).
ALTER TABLE nodes ADD COLUMN agent_protocol INTEGER NOT NULL DEFAULT 0;
