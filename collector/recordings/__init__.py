"""Recordings: `jobpulse import` of the GPU logs people keep (nvidia-smi, dmon, DCGM, gpustat, their
own loggers' tables) read as jobs. Layer 6: above ingest, whose validation every imported batch
passes, and the store and rules it writes and judges through; nothing below imports it. The readers
(`intake` -> `formats` with `table`, `smi`, `gpustat`, `times`, `values` -> `survey`) touch no database;
`importer` stores and judges."""
