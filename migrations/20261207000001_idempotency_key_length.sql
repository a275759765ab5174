-- An Idempotency-Key may be 128 characters (`MAX_IDEMPOTENCY_KEY_LEN`, as
-- the API documents); the column took 64, so an order placed with a longer
-- key was accepted by Redis and then refused by MySQL at every delivery,
-- and ended in the dead letters. Widened in place (the length prefix stays
-- two bytes: no table rebuild).
ALTER TABLE tb_order
    MODIFY COLUMN idempotency_key VARCHAR(128) NULL;
