-- A sale's stock shards (src/sale/shards.rs): how many slots its stock is
-- split across in Redis. 1, the default, is a sale's keys as they always
-- were, so rows written before keep their meaning.
ALTER TABLE tb_product ADD COLUMN stock_shards SMALLINT NOT NULL DEFAULT 1;
