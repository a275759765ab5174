-- Restocks: units an operator added to an open sale (or took away), each
-- once (`restock_id`: the admin's Idempotency-Key, or one the service
-- made). `tb_product.initial_qty` and `available_qty` move with each, in
-- the same transaction, so the audit's equations count from the stock as
-- restocked; this table says how it came to be.
CREATE TABLE IF NOT EXISTS tb_restock (
    restock_id  VARCHAR(191)  NOT NULL,
    product_id  VARCHAR(128)  NOT NULL,
    units       BIGINT        NOT NULL,
    at          BIGINT        NOT NULL,
    PRIMARY KEY (restock_id),
    KEY idx_product (product_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
