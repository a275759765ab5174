-- The sale's own events in the outbox (`sale.sold_out`, `sale.ended`,
-- `sale.retired`): they name a product, not an order, so an event has one
-- of the two (an order's event keeps product_id NULL: its order holds it).
-- tb_product.end_announced: the sale's `sale.ended` is recorded (once).
ALTER TABLE tb_event
    MODIFY order_id VARCHAR(191) NULL,
    ADD COLUMN product_id VARCHAR(191) NULL;

ALTER TABLE tb_product
    ADD COLUMN end_announced TINYINT NOT NULL DEFAULT 0;
