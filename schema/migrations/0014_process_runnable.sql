-- Whether a process was running or waiting for a CPU when sampled, and per roll-up bucket in how
-- many samples: a data loader starved by others on its CPUs uses less than a core yet wants one.
-- Declared in schema/fields.py.
ALTER TABLE jobpulse.process_samples ADD COLUMN runnable boolean;
ALTER TABLE jobpulse.process_rollup ADD COLUMN n_runnable integer NOT NULL DEFAULT 0;
