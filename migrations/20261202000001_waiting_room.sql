-- A sale's optional waiting room (NULL: none): buyers admitted per second,
-- how long an admission stays valid, how long before the start buyers may join.
ALTER TABLE tb_product
    ADD COLUMN room_admit_per_sec  INT NULL,
    ADD COLUMN room_admission_secs INT NULL,
    ADD COLUMN room_join_early_secs INT NULL;
