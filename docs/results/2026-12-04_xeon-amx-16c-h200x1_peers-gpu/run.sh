# What ran, from the repository root on the device machine (Hydra's wheels in /tmp/site, ddp_lab/conf
# linked to conf/, the Fashion-MNIST files and the fortunes text where Debian puts them):
#   a (6ee5ef0): the CUDA tests, ResNet-18 for 2 epochs, the peers races below with all four systems
#   b (298ec49): bash scripts/gpu_check.sh         (the CUDA tests, ResNet-18 for 1 epoch, the profiles, races)
#   c (213d785): bash scripts/gpu_check.sh step    (the step's tests, the GPT race with the foreach control)
GPT="model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw trainer.amp=bf16"
race() { python3 -m ddp_lab.tools.bench.peers --out /tmp/res/$1 --nproc 1 --rounds 3 --steps 200 --warmup 40 "${@:2}"; }
race gpt_bf16 --systems ddp_lab,plain_ddp --variant "measure_light=trainer.measure=light" -- $GPT  # b
race lenet_bf16 --systems ddp_lab,with_accelerate -- model=lenet trainer.amp=bf16  # b
race gpt_bf16 --systems ddp_lab,plain_ddp --variant "foreach=optim.implementation=foreach" -- $GPT  # c
# the profiles (b): 10 steps after 60 of each, then
#   python -m ddp_lab.tools.bench.compare_profiles lab/profile/rank0.json plain/profile/rank0.json
