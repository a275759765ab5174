-- Payment notifications from the payment side, each recorded once: its
-- (payment_id, kind) is what makes a redelivered notification a no-op.
-- `result` is what the books made of it: paid, refund_due (money taken for
-- an order that cannot have it: owed back), amount_mismatch, failed.
CREATE TABLE IF NOT EXISTS tb_payment (
    payment_id  VARCHAR(191)   NOT NULL,
    kind        VARCHAR(32)    NOT NULL,
    order_id    VARCHAR(191)   NOT NULL,
    amount      DECIMAL(65,18) NOT NULL,
    currency    CHAR(3)        NOT NULL,
    result      VARCHAR(16)    NOT NULL,
    webhook_id  VARCHAR(128)   NOT NULL,
    received    BIGINT         NOT NULL,
    PRIMARY KEY (payment_id, kind),
    KEY idx_order (order_id),
    KEY idx_result (result)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
