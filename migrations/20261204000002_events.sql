-- The outbox: every change of an order, written in the same transaction as
-- the change, so an event exists exactly when its change does. `id` is the
-- readers' cursor; `created` is MySQL's own clock (ms), by which a reader
-- waits out transactions still open (see docs/api.md, "Events").
CREATE TABLE IF NOT EXISTS tb_event (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    type        VARCHAR(32)   NOT NULL,
    order_id    VARCHAR(191)  NOT NULL,
    product_id  VARCHAR(128)  NOT NULL,
    created     BIGINT        NOT NULL,
    KEY idx_order (order_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
