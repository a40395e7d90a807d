#!/bin/sh
# transformers' LlamaForCausalLM as it is, 24 blocks of 1024 (283.8M parameters, 1.06 GiB of fp32 weights,
# 4.2 GiB of model state with AdamW), fine-tuned from a save_pretrained directory on 8 emulated hosts of LIMIT
# each (cluster up --mem, 10gbit links, one rank a host): DDP (a whole copy a rank) is refused before its first
# step; fsdp builds it a unit at a time, copies each unit's pretrained weights in as the unit is made, trains 3
# steps and writes model.pt, model.safetensors and hf/, which from_pretrained loads back (check.py). Every
# host's peak is read from its memory cgroup.
# Usage (from the repository root, as root): [VENV=path/to/venv] [LIMIT=1.6g] sh <this folder>/run.sh
here=$(dirname "$0")
py=${VENV:-.venv}/bin/python
limit=${LIMIT:-1.6g}
out=${OUT:-/tmp/hfwall}
model="model=hf_llama model.overrides.num_hidden_layers=24 model.overrides.hidden_size=1024
  model.overrides.intermediate_size=2816 model.overrides.num_attention_heads=16 model.overrides.num_key_value_heads=8"
common="$model model.pretrained=$out/pretrained data=text_documents data.block_size=32 data.val_fraction=0.005
  data.batch_size=16 optim=adamw trainer.amp=off trainer.progress=false trainer.max_steps=3 trainer.keep_ckpts=0
  dist.timeout_s=900"
mkdir -p "$out"
peaks() {  # every host's memory cgroup: its peak (max_usage_in_bytes), then reset for the next run
  for d in /sys/fs/cgroup/memory/ddplab/ddplab-hfwall-*; do
    printf '%s %s MiB; ' "$(basename "$d")" $(( $(cat "$d/memory.max_usage_in_bytes") / 1048576 ))
    echo 0 > "$d/memory.max_usage_in_bytes"
  done
}
run() {  # name, overrides...
  name=$1; shift
  start=$(date +%s)
  "$py" -m ddp_lab.tools.cluster run --name hfwall --hosts 8 --max-restarts 0 --grace-s 60 -- -m ddp_lab.train \
    $common "$@" >> "$here/$name.log" 2>&1
  rc=$?
  echo "$name rc $rc $(( $(date +%s) - start )) s; cgroup peaks: $(peaks)" | tee -a "$here/runs.txt"
}
# the directory a user downloaded: save_pretrained of the same configuration (seed 123), outside the cluster
[ -f "$out/pretrained/config.json" ] || "$py" - "$out/pretrained" <<'PY' | tee -a "$here/runs.txt"
import sys, torch
from ddp_lab.models.hf import transformers_model
overrides = dict(num_hidden_layers=24, hidden_size=1024, intermediate_size=2816, num_attention_heads=16,
                 num_key_value_heads=8, vocab_size=256, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                 pad_token_id=0)
torch.manual_seed(123)
model = transformers_model("llama", "causal_lm", overrides)
model.save_pretrained(sys.argv[1])
print(f"pretrained: {sum(p.numel() for p in model.parameters()):,} parameters saved to {sys.argv[1]}")
PY
"$py" -m ddp_lab.tools.cluster down --name hfwall > /dev/null 2>&1
"$py" -m ddp_lab.tools.cluster up --name hfwall --hosts 8 --rate 10gbit --mem "$limit" | tee "$here/cluster.txt"
peaks > /dev/null
rm -rf "$out/ddp" "$out/fsdp"
run ddp sync=ddp hydra.run.dir="$out/ddp"
run fsdp sync=fsdp hydra.run.dir="$out/fsdp"
"$py" -m ddp_lab.tools.cluster down --name hfwall
"$py" "$here/check.py" "$out/fsdp" | tee -a "$here/runs.txt"
