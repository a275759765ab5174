-- The books of a flash sale. Redis decides every order; these tables are where
-- accepted orders end up (written by the stream workers, never on the order path).
-- Times are epoch milliseconds (bigint), as in the original design.

CREATE TABLE IF NOT EXISTS tb_product (
    id             BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    product_id     VARCHAR(128)  NOT NULL,
    price          DECIMAL(65,18) NOT NULL,
    available_qty  BIGINT        NOT NULL,
    title          VARCHAR(1024) NOT NULL,
    start_time     BIGINT        NOT NULL,
    end_time       BIGINT        NOT NULL,
    limit_per_user BIGINT        NOT NULL DEFAULT 1,
    created        BIGINT        NOT NULL,
    updated        BIGINT        NOT NULL,
    UNIQUE KEY uk_product_id (product_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- order_id is UNIQUE: it is what makes persisting a redelivered stream entry a no-op.
CREATE TABLE IF NOT EXISTS tb_order (
    id         BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id   VARCHAR(191)   NOT NULL,
    user_id    BIGINT         NOT NULL,
    product_id VARCHAR(128)   NOT NULL,
    quantity   BIGINT         NOT NULL,
    price      DECIMAL(65,18) NOT NULL,
    status     VARCHAR(16)    NOT NULL,
    created    BIGINT         NOT NULL,
    updated    BIGINT         NOT NULL,
    UNIQUE KEY uk_order_id (order_id),
    KEY idx_user (user_id, created),
    KEY idx_product_status (product_id, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
