-- The waiting room follows the backend (issue 33): the pace drops toward a
-- floor while orders wait to be persisted and climbs back to the ceiling
-- (room_admit_per_sec); an active cap bounds the buyers holding an unused
-- admission; a join may cost a proof of work (bits). NULL floor: a tenth
-- of the ceiling; NULL cap: none; NULL difficulty: none.
ALTER TABLE tb_product
    ADD COLUMN room_admit_floor_per_sec INT     NULL,
    ADD COLUMN room_active_cap          INT     NULL,
    ADD COLUMN room_join_difficulty     TINYINT NULL;
