"""Predicted against measured peak per rank, on models the estimate was not calibrated on: a CNN
(ResNet-18), a long context (gpt_small at 1024 tokens), bf16 gathers (gpt2 under trainer.amp=bf16), a large
root (transformers' Llama with a 32,000-token vocabulary, untied: the embedding and head outside every unit).
Each run: 2 ranks on loopback (torchrun --standalone), 3 steps, an evaluation and model.pt, so every rank's peak
RSS (summary.json peak_mem_mb_by_rank) covers build, steps, evaluation and save. Appends to runs.jsonl.
Usage, from the repository root: [python] docs/results/<this folder>/run.py [ROUNDS]"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
COMMON = ["trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.progress=false", "trainer.log_every=1"]
MODELS = {
    "resnet18": ["model=resnet18", "data=fashion_mnist", "data.batch_size=64", "optim=sgd", "trainer.amp=off"],
    "gpt_small ctx 1024": ["model=gpt_small", "model.block_size=1024", "data=text", "data.batch_size=4",
                           "optim=adamw", "trainer.amp=off", "data.val_fraction=0.01"],
    "gpt2 ctx 128 fp32": ["model=gpt2", "model.block_size=128", "data=text", "data.batch_size=8", "optim=adamw",
                          "trainer.amp=off", "data.val_fraction=0.002"],
    "gpt2 ctx 128 bf16": ["model=gpt2", "model.block_size=128", "data=text", "data.batch_size=8", "optim=adamw",
                          "trainer.amp=bf16", "data.val_fraction=0.002"],
    "llama vocab 32000": ["model=hf_llama", "model.overrides.vocab_size=32000", "model.overrides.hidden_size=256",
                          "model.overrides.intermediate_size=704", "model.overrides.max_position_embeddings=128",
                          "+model.overrides.tie_word_embeddings=false", "data=text_documents", "data.batch_size=8",
                          "optim=adamw", "trainer.amp=off"],
}
SYNCS = {"ddp": ["sync=ddp"], "zero3": ["sync=zero", "sync.zero_stage=3"], "fsdp": ["sync=fsdp"]}
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
for rnd in range(ROUNDS):
    for model, mo in MODELS.items():
        for sync, so in SYNCS.items():
            with tempfile.TemporaryDirectory() as tmp:
                over = [*mo, *so, *COMMON, f"hydra.run.dir={tmp}/run"]
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       "-m", "ddp_lab.train", *over]
                t0 = time.time()
                p = subprocess.run(cmd, capture_output=True, text=True)
                row = {"round": rnd, "model": model, "sync": sync, "rc": p.returncode, "wall_s": round(time.time() - t0, 1),
                       "rev": rev, "overrides": over[:-1]}
                try:
                    s = json.loads((Path(tmp) / "run" / "summary.json").read_text())
                    row.update({k: s.get(k) for k in ("peak_mem_mb_by_rank", "predicted_peak_mb_by_rank",
                                                      "build_peak_mb_by_rank", "step_ms", "parameters")})
                    row["ratio"] = round(max(m / p for m, p in zip(s["peak_mem_mb_by_rank"],
                                                                  s["predicted_peak_mb_by_rank"])), 3)
                except (FileNotFoundError, TypeError, KeyError) as e:
                    row["error"] = (p.stdout + p.stderr)[-1500:]
                print(json.dumps({k: row.get(k) for k in ("model", "sync", "rc", "wall_s", "peak_mem_mb_by_rank",
                                                          "predicted_peak_mb_by_rank", "ratio")}), flush=True)
                with open(HERE / "runs.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
