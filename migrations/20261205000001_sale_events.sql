-- The sale's own events in the outbox (`sale.sold_out`, `sale.ended`,
-- `sale.retired`): they name a product, not an order, so an event has one
-- of the two (an order's event keeps product_id NULL: its order holds it).
-- A change of many orders in one transaction (a worker's batch, the
-- sweeper's cancels) is one row: `orders` (their ids, comma-separated) and
-- `events` (how many); an event's id is its row's id × 10,000 + its place.
-- tb_product.end_announced: the sale's `sale.ended` is recorded (once).
ALTER TABLE tb_event
    MODIFY order_id VARCHAR(191) NULL,
    ADD COLUMN product_id VARCHAR(191) NULL,
    ADD COLUMN orders MEDIUMTEXT NULL,
    ADD COLUMN events INT NOT NULL DEFAULT 1;

ALTER TABLE tb_product
    ADD COLUMN end_announced TINYINT NOT NULL DEFAULT 0;

-- Ids read before this migration were row ids, each row one event: the
-- same event's id is now row id × 10,000. Delivery cursors and dead letters
-- follow (a pull consumer multiplies its stored cursor by 10,000).
UPDATE tb_event_delivery SET delivered_up_to = delivered_up_to * 10000;
UPDATE tb_event_dead SET event_id = event_id * 10000;
