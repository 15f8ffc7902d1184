-- The web view's sign-ins (issue 44). A session is a random id the browser holds in an
-- HttpOnly cookie; the ledger keeps only its SHA-256, so a copy of the ledger signs no one in.
-- It names the operator token it came from by the token's hash (which the configuration holds
-- too): a token removed from the configuration ends its sessions at their next request. Both
-- HA replicas read the same rows, so a session works on either.
CREATE TABLE ui_sessions (
    id_hash     TEXT   PRIMARY KEY,
    token_hash  TEXT   NOT NULL,
    token_name  TEXT   NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX ui_sessions_by_expiry ON ui_sessions (expires_at);
-- One-time sign-in links (`pl ui`): the code's SHA-256, used once, within minutes.
CREATE TABLE ui_links (
    code_hash   TEXT   PRIMARY KEY,
    token_hash  TEXT   NOT NULL,
    token_name  TEXT   NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER
);
