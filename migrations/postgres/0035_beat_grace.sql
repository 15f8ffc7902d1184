-- The extra silence a node gets before it is quiet, unhealthy or lost: its last heartbeat was
-- told to wait longer than the interval the thresholds were set for (the fleet is large and
-- the control plane spreads its beats; state_schema::placement::heartbeats). Written with
-- each heartbeat; liveness reads `last_seen + beat_grace_ms`.
ALTER TABLE nodes ADD COLUMN beat_grace_ms BIGINT NOT NULL DEFAULT 0;
