-- The outbox: every change of an order, written in the same transaction as
-- the change, so an event exists exactly when its change does. `id` is the
-- readers' cursor; `created` is MySQL's own clock (ms), by which a reader
-- waits out transactions still open (see docs/api.md, "Events"). One
-- B-tree only (the order's details are joined from tb_order): each index
-- costs the workers' transaction per persisted order (BENCHMARKS.md).
CREATE TABLE IF NOT EXISTS tb_event (
    id          BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    type        VARCHAR(32)   NOT NULL,
    order_id    VARCHAR(191)  NOT NULL,
    created     BIGINT        NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
