-- Every unique key of a table Citus distributes must include its distribution column
-- (collector/store/citus.py): the flag tables' keys gain the job (job_flags) and the node
-- (node_flags). id stays first, so a lookup by id reads the same index as before.
ALTER TABLE jobpulse.job_flags DROP CONSTRAINT job_flags_pkey, ADD PRIMARY KEY (id, job_id);
ALTER TABLE jobpulse.node_flags DROP CONSTRAINT node_flags_pkey, ADD PRIMARY KEY (id, node);
