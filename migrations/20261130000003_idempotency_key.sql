-- The Idempotency-Key an order was placed with (NULL: none). Redis keeps it
-- as the key's record; MySQL keeps it so that a sale whose Redis lost writes
-- (a failover) gets the record back from the books, and a retry with the key
-- still answers the first order instead of placing a second one.
ALTER TABLE tb_order
    ADD COLUMN idempotency_key VARCHAR(64) NULL;
