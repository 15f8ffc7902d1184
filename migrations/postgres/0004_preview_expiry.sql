-- When a preview deployment expires: its branch's last commit plus the repository's
-- previews.ttlHours. NULL for deployments of the applied branch, which never expire.
ALTER TABLE deployments ADD COLUMN expires_at BIGINT;
CREATE INDEX deployments_expiring ON deployments (action, expires_at);
