-- A sale paused by an operator (since when, epoch ms; NULL: live): the
-- books' copy of the pause Redis decides orders by (`pause_sale.lua`),
-- shown with the product and kept for a sale rebuilt from the books.
ALTER TABLE tb_product
    ADD COLUMN paused BIGINT NULL;
