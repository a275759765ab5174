-- A sale's end of life (issue 21): closed early by an admin, retired once
-- ended and settled (its final audit recorded below, it left the registry of
-- open sales), purged (its Redis keys deleted after a short grace).
-- closed:  when an admin closed it (epoch ms; end_time moved to it), NULL if not
-- retired: when its final audit was recorded (epoch ms), NULL while it lives
-- purged:  when its Redis keys were deleted (epoch ms), NULL until then
ALTER TABLE tb_product
    ADD COLUMN closed  BIGINT NULL,
    ADD COLUMN retired BIGINT NULL,
    ADD COLUMN purged  BIGINT NULL,
    ADD KEY idx_retired_end (retired, end_time),
    ADD KEY idx_purged_retired (purged, retired);

-- The final audit of a retired sale: the figures `flashsale audit` showed
-- when it was retired (Redis is gone after that), one row per sale.
CREATE TABLE IF NOT EXISTS tb_sale_audit (
    product_id        VARCHAR(128) NOT NULL PRIMARY KEY,
    initial_qty       BIGINT       NOT NULL,
    redis_stock       BIGINT       NOT NULL,
    confirmed         BIGINT       NOT NULL,
    paid              BIGINT       NOT NULL,
    cancelled         BIGINT       NOT NULL,
    available_qty     BIGINT       NOT NULL,
    orders            BIGINT       NOT NULL,
    repaired_orders   BIGINT       NOT NULL,
    repaired_units    BIGINT       NOT NULL,
    repaired_releases BIGINT       NOT NULL,
    repaired_idem     BIGINT       NOT NULL,
    retired           BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
