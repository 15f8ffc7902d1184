-- Event cursors under concurrent writers. A sequence value is taken when a row is inserted, not
-- when its transaction commits, so a reader paging by `id` could pass an id whose transaction
-- was still open and never see that event. Readers therefore serve only up to a horizon: the
-- largest visible id, once every transaction that held a transaction id at that moment has
-- ended (Ledger::event_horizon). For that to hold, a transaction must have its transaction id
-- before it takes an event id: this trigger takes both, in that order.
-- (SQLite has one writer at a time, so its ids commit in order and it needs none of this.)
ALTER TABLE events ALTER COLUMN id DROP DEFAULT;
CREATE FUNCTION events_take_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_current_xact_id();
    NEW.id := nextval(pg_get_serial_sequence('events', 'id'));
    RETURN NEW;
END
$$;
CREATE TRIGGER events_take_id BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION events_take_id();
