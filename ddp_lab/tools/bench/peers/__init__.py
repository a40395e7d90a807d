"""ddp_lab raced against the loops its users would otherwise write, on the same module and data.

    python -m ddp_lab.tools.bench.peers --out docs/results/<date>_<machine>_peers -- \\
        model=gpt_small model.block_size=128 data=text data.batch_size=16 optim=adamw

Each round launches, by torchrun on this machine, ddp_lab (`ddp_lab.train` with the overrides) and
each peer: `plain_ddp` (pytorch/examples' tutorial loop), `with_fabric` (Lightning Fabric) and
`with_accelerate` (Accelerate), where installed (`pip install lightning-fabric accelerate`). A peer
builds the module, data and optimizer from the same overrides by ddp_lab's own builders
(peers/peer_parts.py), so only the trainer differs. The order rotates each round (interleaved); each
run's figure is the mean step after the warm-up steps, as ddp_lab's summary.json counts it.
"""
