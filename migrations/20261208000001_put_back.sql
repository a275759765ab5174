-- What the repair after a failover of the books put back (see
-- `worker::repair`): an order, a cancel or a payment that the old primary
-- held alone and the new one lacked, put back from what Redis still had.
-- Listed for the operator by `flashsale audit` and the admin audit route,
-- and kept after the sale retires. One row per thing put back (`item`: the
-- payment's id and kind, or '' for an order or a cancel).
CREATE TABLE IF NOT EXISTS tb_put_back (
    id          BIGINT       NOT NULL AUTO_INCREMENT,
    product_id  VARCHAR(128) NOT NULL,
    what        VARCHAR(16)  NOT NULL,
    order_id    VARCHAR(191) NOT NULL,
    item        VARCHAR(191) NOT NULL DEFAULT '',
    result      VARCHAR(16)  NULL,
    put_back    BIGINT       NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_put_back (what, order_id, item),
    KEY idx_product (product_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
