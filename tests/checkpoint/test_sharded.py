"""Checkpoints of sharded weights (zero stage 3, fsdp): each rank writes and reads its own shards, no rank
gathers the model; at another world size a rank reads only the rows it will own."""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed.tensor  # noqa: F401 (fsdp's rank files hold DTensors: torch.load needs it imported)

from ddp_lab.checkpoint.reshard import my_rows
from tests.conftest import run_module, tiny_overrides
from tests.multiproc import run_in_processes
from tests.sync import sync_cfg
from tests.test_resume import KILL, _same_weights


@pytest.mark.parametrize("rows,old_n,n", [(10, 4, 3), (10, 3, 4), (10, 2, 4), (7, 4, 2), (3, 4, 5), (12, 4, 4)])
def test_a_rank_reads_only_the_old_ranks_that_hold_its_rows(rows, old_n, n):
    whole = torch.arange(rows * 2.0).reshape(rows, 2)
    old_c, c = -(-rows // old_n), -(-rows // n)
    pieces = [whole[q * old_c:(q + 1) * old_c] for q in range(old_n)]  # torch.chunk's rows (some may be empty)
    for rank in range(n):
        asked = []
        got = my_rows(lambda q, asked=asked: asked.append(q) or pieces[q], rows, old_n, rank, n)
        assert torch.equal(got, whole[rank * c:(rank + 1) * c])
        lo, hi = min(rank * c, rows), min((rank + 1) * c, rows)
        # (a rank that holds no row asks rank 0 for none, to learn their shape)
        assert asked == ([q for q in range(old_n) if q * old_c < hi and lo < (q + 1) * old_c] or [0])


GPT = dict(vocab_size=64, block_size=8, n_layer=3, n_head=2, n_embd=16)


def _save_then_load(rank, world_size, mode, folder, write, model_kind="gpt"):
    """Writing (`write`): this rank's sharded state to folder; else read back every old rank's file, mapped,
    as a resume at another world size does. Either way: the whole weights, gathered."""
    from ddp_lab.distributed import DistEnv
    from ddp_lab.models.gpt import gpt
    from ddp_lab.models.meta_init import MetaInit, build_on_meta
    from ddp_lab.sync import SyncContext, build_sync

    env = DistEnv(rank, world_size, 0, torch.device("cpu"), "gloo")
    torch.manual_seed(1 if write else 2)  # (read: other initial weights, all overwritten by the load)
    if model_kind == "gpt":
        model, _ = build_on_meta(lambda: gpt(**GPT))
    else:  # a user's model with a frozen block: its pieces sharded and resharded too
        from tests.sync.user_model import UserTransformer
        model, _ = build_on_meta(lambda: UserTransformer(n_layer=3, frozen="block"))
    cfg = sync_cfg("zero", "builtin", zero_stage=3, bucket_cap_mb=0.1) if mode == "zero3" else sync_cfg("fsdp")
    sync = build_sync(cfg, model, env, SyncContext(init=MetaInit(model)))
    if write:
        whole, mine = sync.sharded_state(model)
        torch.save({"whole": whole, "weights": mine}, f"{folder}/rank{rank}.pt")
    else:
        old = sorted(folder.glob("rank*.pt"))
        everyone = [torch.load(p, weights_only=True, mmap=True) for p in old]
        sync.load_sharded_state(model, everyone[0]["whole"], None, [e["weights"] for e in everyone])
    return {k: t.tolist() for k, t in sync.each_weight(model)}  # (exact: float32 in Python floats)


# (fsdp's frozen tensors are DTensors resharded as its others are; stage 3's frozen pieces have their own path)
@pytest.mark.parametrize("mode,model_kind", [("zero3", "gpt"), ("fsdp", "gpt"), ("zero3", "frozen block")])
def test_sharded_weights_written_by_2_ranks_load_exactly_on_3_and_4(mode, model_kind, tmp_path):
    saved = run_in_processes(_save_then_load, 2, mode, tmp_path, True, model_kind)[0]
    for n in (3, 4):
        loaded = run_in_processes(_save_then_load, n, mode, tmp_path, False, model_kind)[0]
        assert list(loaded) == list(saved)
        for k in saved:
            assert loaded[k] == saved[k], (n, k)


SHARDED = {"zero3": ["sync=zero", "sync.zero_stage=3", "trainer.amp=off"], "fsdp": ["sync=fsdp", "trainer.amp=off"],
           # bf16 weights gathered, fp32 master pieces stepped and saved
           "zero3 bf16": ["sync=zero", "sync.zero_stage=3", "trainer.amp=bf16"]}
CKPT = ["trainer.ckpt_every_steps=3", "trainer.keep_ckpts=10", "dist.timeout_s=60"]


@pytest.mark.system
@pytest.mark.parametrize("mode", list(SHARDED))
def test_a_sigkilled_sharded_run_resumes_from_its_shards_bit_identical(mode, tiny_fmnist, tmp_path):
    run_dir = tmp_path / "killed"
    with ThreadPoolExecutor(2) as pool:  # most of a launch is waiting: both at once
        ref = pool.submit(run_module, "ddp_lab.train", tiny_overrides(tiny_fmnist, tmp_path / "ref") + CKPT +
                          SHARDED[mode], nproc=2)
        proc = pool.submit(run_module, "ddp_lab.train", tiny_overrides(tiny_fmnist, run_dir) + CKPT + SHARDED[mode],
                           nproc=2, torchrun_args=["--max-restarts=1"], env=KILL)
        ref, proc = ref.result(), proc.result()
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step-9'} (step 9, epoch 2, batch 1)" in proc.stdout
    _same_weights(tmp_path / "ref", run_dir)
    step = run_dir / "checkpoints" / "step-15"
    shared = torch.load(step / "state.pt", weights_only=True)
    assert shared["weights_sharded"] and shared["model"] == {}  # LeNet: no buffers, no frozen weights
    halves = [torch.load(step / f"rank{r}.pt", weights_only=True)["weights"] for r in (0, 1)]
    held = [sum(t.numel() for t in (h.values() if mode == "fsdp" else [h["pieces"]])) for h in halves]
    assert all(t.dtype == torch.float32 for h in halves for t in (h.values() if mode == "fsdp" else [h["pieces"]]))
    assert sum(held) >= 129_068 and max(held) <= 129_068 // 2 + 64  # each rank its half of LeNet's weights
