-- The order lifecycle (pay, cancel, payment timeout) and the audit.
-- initial_qty: the stock a product was created with (available_qty moves).
-- opened: when its sale was first loaded into Redis (epoch ms), NULL before.
ALTER TABLE tb_product
    ADD COLUMN initial_qty BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN opened BIGINT NULL;
UPDATE tb_product SET initial_qty = available_qty WHERE initial_qty = 0;

-- released: a cancelled order's units are back in Redis too (the second half
-- of a cancel; 0 between the MySQL commit and the Redis release).
ALTER TABLE tb_order
    ADD COLUMN released BOOLEAN NOT NULL DEFAULT FALSE,
    ADD KEY idx_status_created (status, created),
    ADD KEY idx_status_released (status, released);
