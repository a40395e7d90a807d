"""What a run measures and reports: throughput and MFU (meter, mfu, step_measure), memory,
TensorBoard and the console lines (metrics), stragglers, profiles, the target race (target),
where each rank is (position), and records' provenance. A run's summary.json is written by
ddp_lab/training/results.py, with metrics' write_json_atomic."""
