-- The ticks a process row stands for beyond itself: the agent holds back a node's process samples
-- while none changed (agent/sources/processes.py, ChangeOnly) and sends the run's last tick with
-- how many came before it; roll-ups, rank bins and reports weigh a row by 1 + held. NULL: 0 (older
-- agents, imports). Declared in schema/fields.py.
ALTER TABLE jobpulse.process_samples ADD COLUMN held smallint;
