-- When a node was announced lost (`node-lost`, silent past the lost threshold); 0 while it is
-- not. Cleared, with `node-back`, once it is heard from again (`store/placement.rs`).
ALTER TABLE nodes ADD COLUMN lost_at BIGINT NOT NULL DEFAULT 0;
