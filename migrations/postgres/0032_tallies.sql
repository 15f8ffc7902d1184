-- Counters the control plane's metrics and its service levels are made of, written in the
-- transaction that records what they count, so every replica of an HA pair serves the same
-- totals and a restart resets none: events by kind, jobs ended by task kind, outcome and
-- failure code, rollouts by outcome, and the buckets of the commit-to-live and
-- route-publication histograms. `family` names the counter and `labels` its label values
-- (from closed sets only: no name a user or an agent chooses). Each is kept twice: its total
-- (`hour` -1), which `/metrics` serves and which only grows, and per UTC hour since the epoch,
-- which `pl status` sums over the last day; hours older than 8 days are deleted by the pass.
CREATE TABLE tallies (
    family TEXT   NOT NULL,
    labels TEXT   NOT NULL,
    hour   BIGINT NOT NULL,
    value  BIGINT NOT NULL,
    PRIMARY KEY (family, labels, hour)
);
