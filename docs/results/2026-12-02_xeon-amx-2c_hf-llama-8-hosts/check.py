"""The fsdp run's hf/ loaded back with transformers' from_pretrained, against its model.pt; its summary's peaks
and predictions. python check.py <run dir>"""
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

run = Path(sys.argv[1])
loaded = AutoModelForCausalLM.from_pretrained(str(run / "hf")).state_dict()
saved = torch.load(run / "model.pt", weights_only=True, mmap=True)
same = loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
print(f"from_pretrained({run / 'hf'}): {len(loaded)} tensors, equal to model.pt: {same}")
summary = json.loads((run / "summary.json").read_text())
print("summary:", {k: summary.get(k) for k in ("steps", "train_loss", "val_loss", "model_state_bytes",
                                               "peak_mem_mb_by_rank", "predicted_peak_mb_by_rank")})
