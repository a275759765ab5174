-- One index for both background scans of tb_order instead of two, since
-- every insert maintains each index (issue 18, BENCHMARKS.md "What a
-- persisted order costs"): a confirmed order always has released = 0, so
-- the payment sweeper's "confirmed, created before T" is the prefix
-- (status, released) and a range on created; the reconciler's "cancelled,
-- not released" is the prefix (status, released).
ALTER TABLE tb_order
    DROP KEY idx_status_created,
    DROP KEY idx_status_released,
    ADD KEY idx_status_released_created (status, released, created);
