-- How many CPUs a process may run on (its affinity mask: what Slurm gave its task), and the most
-- of them per roll-up bucket: an input pipeline in threads (tf.data, DALI, OpenMP decoding) is
-- saturated when it keeps all of them busy. Declared in schema/fields.py.
ALTER TABLE jobpulse.process_samples ADD COLUMN cpus_allowed smallint;
ALTER TABLE jobpulse.process_rollup ADD COLUMN max_cpus_allowed smallint;
