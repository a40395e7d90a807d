"""Print a run's per-epoch perf/samples_per_sec from its TensorBoard folder, as JSON."""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({"perf/samples_per_sec": [e.value for e in acc.Scalars("perf/samples_per_sec")],
                  "perf/step_ms": [e.value for e in acc.Scalars("perf/step_ms")]}))
