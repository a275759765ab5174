-- The buyers who tried, counted without keeping them (`metrics::distinct`):
-- per second and process, the distinct-buyers registers raised that second
-- and their new rank, a JSON object of register -> rank (only what was
-- raised). The report merges every row's registers, each its highest.
ALTER TABLE tb_sale_second ADD COLUMN IF NOT EXISTS buyers TEXT NOT NULL DEFAULT '{}';
