-- The kept reports' index: each report's figures without its timeline, so
-- the dashboard's list of past sales reads kilobytes, not every report's
-- seconds; newest first. Reports kept before have none (NULL): the list
-- reads those whole, once each.
ALTER TABLE tb_sale_report
    ADD COLUMN summary MEDIUMTEXT NULL,
    ADD INDEX idx_made (made);

-- A sale's own events (paused, resumed, ...), found by its id: the
-- report's marks read them. Orders' events have no product_id (NULL).
ALTER TABLE tb_event ADD INDEX idx_product (product_id, id);
