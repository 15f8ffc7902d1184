-- The images of the control plane's own store (`[images]`) each accepted revision names: what
-- `pl image gc` keeps, whatever the branch's head says now (a `pl rollback --commit` to an old
-- revision needs its images). Written with the revision's row; append-only like it.
CREATE TABLE revision_images (
    revision_id BIGINT  NOT NULL REFERENCES revisions (id),
    image       TEXT    NOT NULL,
    PRIMARY KEY (revision_id, image)
);
