-- Roll-ups folded behind ingest (collector/store/fold.py): samples with a time at or after
-- `folded_before` are left raw by the ingest statement and folded into their buckets by the
-- leader a few seconds later, many samples of a bucket in one upsert instead of one upsert each;
-- older samples (late batches, spool replays) are folded as they are stored. NULL: every sample is
-- folded as it is stored (a database no collector leads yet). One row; local on Citus.
CREATE TABLE jobpulse.fold_mark (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    folded_before timestamptz
);
INSERT INTO jobpulse.fold_mark (one) VALUES (true);
-- What the leader reads: the last seconds of samples by time. A block range index would cost nothing
-- on insert, but it finds only ranges already summarized and scans every page past them: until
-- VACUUM summarized a day's partition (after a fifth of it, hours), each fold would read more of
-- it. A B-tree on the time takes each new row at its rightmost page.
CREATE INDEX gpu_samples_time ON jobpulse.gpu_samples (ts);
CREATE INDEX process_samples_time ON jobpulse.process_samples (ts);
