-- Volume moves (`pl volume move`): while one is under way `moving_to` names the node it goes
-- to (its role is stopped on purpose, and drift repairs leave it alone); `move_asked_at` is
-- when it was asked for, `moved_from` the node it left once its data was restored on the new
-- one, and `moved_up_at` when its role was healthy there (the downtime's end), or `move_failure` why it
-- ended without moving. They stay after the move, for `pl volumes` and the move's report.
ALTER TABLE volumes ADD COLUMN moving_to TEXT;
ALTER TABLE volumes ADD COLUMN move_asked_at INTEGER;
ALTER TABLE volumes ADD COLUMN moved_from TEXT;
ALTER TABLE volumes ADD COLUMN move_failure TEXT;
ALTER TABLE volumes ADD COLUMN moved_up_at INTEGER;
-- Completions look for moves that wait for their role only when one is under way.
CREATE INDEX volumes_moving ON volumes (moving_to) WHERE moving_to IS NOT NULL;
-- Kept generations: a volume's generations before its current one (a restore or a move made
-- a newer one), each on the node that holds it, kept (never mounted again) until an admin
-- removes it (`pl volume rm --generation`).
CREATE TABLE volume_generations (
    environment TEXT    NOT NULL,
    volume      TEXT    NOT NULL,
    generation  INTEGER NOT NULL,
    node        TEXT    NOT NULL,
    kept_at     INTEGER NOT NULL,
    PRIMARY KEY (environment, volume, generation)
);
