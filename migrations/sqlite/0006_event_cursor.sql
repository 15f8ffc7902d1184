-- Event cursors under concurrent writers: SQLite has one writer at a time, so its event ids
-- commit in order and a cursor never passes an event that could still appear. Nothing to do;
-- this keeps the two backends' migrations numbered alike (see the PostgreSQL 0006).
SELECT 1;
