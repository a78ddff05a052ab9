-- ECC counters and row-remap flags in the roll-ups, so the ECC rules read a window of a GPU from a
-- few rows: each counter's min and max per bucket (the increase over a range is max - min) and
-- whether a remap was pending or failed. Declared in schema/fields.py.
ALTER TABLE jobpulse.gpu_rollup
    ADD COLUMN min_ecc_sbe_total bigint,
    ADD COLUMN max_ecc_sbe_total bigint,
    ADD COLUMN min_ecc_dbe_total bigint,
    ADD COLUMN max_ecc_dbe_total bigint,
    ADD COLUMN any_remap_pending boolean,
    ADD COLUMN any_remap_failure boolean;
