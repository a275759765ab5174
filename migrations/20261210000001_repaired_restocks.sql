-- Restocks a Redis failover lost and the reconciler made again from the
-- books (`restock.lua` "again"), kept with a retired sale's final audit as
-- the other repairs are.
ALTER TABLE tb_sale_audit
    ADD COLUMN IF NOT EXISTS repaired_restocks      BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS repaired_restock_units BIGINT NOT NULL DEFAULT 0;
