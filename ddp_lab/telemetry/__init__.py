"""What a run measures and reports: throughput and MFU (meter, mfu), TensorBoard and
summary.json (metrics, results), stragglers, profiles, and records' provenance."""
