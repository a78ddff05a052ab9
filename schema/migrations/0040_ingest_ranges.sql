-- The ingest ledger, folded: one row per run of consecutive seqs of one agent instance, made by the
-- leader from ledger days before yesterday (`store/ledger.py`). A batch a second per node made the
-- per-batch ledger about 45 bytes a GPU sample; an agent's day is one row here. Replays are still
-- found exactly (a seq inside a run is a duplicate; a seq missing from the ledger stays outside every
-- run), and the counts of a run are its batches' sums.
CREATE TABLE jobpulse.ingest_ranges (
    agent_instance text        NOT NULL,
    first_seq      bigint      NOT NULL,
    last_seq       bigint      NOT NULL,
    cluster        text        NOT NULL,
    node           text        NOT NULL,
    agent_version  text        NOT NULL,
    first_created  timestamptz NOT NULL,
    last_created   timestamptz NOT NULL,
    last_received  timestamptz NOT NULL,
    batches        bigint      NOT NULL,
    rows           jsonb       NOT NULL,  -- rows per table, summed over the run's batches
    dropped        jsonb       NOT NULL,  -- what the agent reported lost, summed likewise
    PRIMARY KEY (agent_instance, first_seq),
    CHECK (last_seq >= first_seq)
);
