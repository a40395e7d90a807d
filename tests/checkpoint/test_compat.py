"""Whether a checkpoint fits this run: the config hash, the keys it leaves out, the world size."""
import pytest

from ddp_lab import checkpoint
from ddp_lab.config import ConfigError


def test_config_hash_ignores_settings_that_do_not_change_training(compose_train):
    base = checkpoint.config_subset(compose_train())
    same = checkpoint.config_subset(compose_train([
        "trainer.max_steps=3", "trainer.log_every=7", "trainer.resume=auto",
        "trainer.ckpt_every_steps=5", "trainer.keep_ckpts=9", "data.root=/elsewhere",
        "data.num_workers=3", "dist.timeout_s=5", "trainer.progress=false",
        "model.crop_unused_border=false", "model.pad_channels_to=0", "sync.poll=false"]))
    assert checkpoint.config_hash(base) == checkpoint.config_hash(same)
    # lenet and lenet_fast: the same function and weights, so one resumes as the other
    plain = checkpoint.config_subset(compose_train(["model=lenet"]))
    fast = checkpoint.config_subset(compose_train(["model=lenet_fast"]))
    assert checkpoint.config_hash(plain) == checkpoint.config_hash(fast)
    for change in ("optim.lr=0.05", "seed=1", "trainer.epochs=3", "trainer.grad_accum=2",
                   "data.batch_size=128", "model=resnet18", "sync.compress=bf16",
                   "sync=per_param"):  # (per_param: auto's keys, another strategy)
        other = checkpoint.config_subset(compose_train([change]))
        assert checkpoint.config_hash(other) != checkpoint.config_hash(base), change


def test_validate_names_every_differing_key(compose_train):
    saved = checkpoint.config_subset(compose_train())
    meta = {"world_size": 2, "config_hash": checkpoint.config_hash(saved), "config": saved}
    checkpoint.validate("ck", meta, saved)  # same: no error
    now = checkpoint.config_subset(compose_train(["optim.lr=0.05", "seed=3"]))
    with pytest.raises(ConfigError) as e:
        checkpoint.validate("ck", meta, now)
    assert str(e.value) == (
        "cannot resume from ck: config hash differs (optim.lr: 0.2 in the checkpoint vs 0.05 "
        "now; seed: 0 in the checkpoint vs 3 now). Either set those keys back to the "
        "checkpoint's values, or start a new run directory (hydra.run.dir=... or "
        "DDP_LAB_RUN_ID=<name>, with trainer.resume=none)")


def test_a_checkpoint_that_hashed_a_key_now_left_out_still_resumes(compose_train):
    now = checkpoint.config_subset(compose_train())
    older = {g: dict(v) if isinstance(v, dict) else v for g, v in now.items()}
    older["model"]["crop_unused_border"] = False  # hashed when that checkpoint was written
    meta = {"world_size": 2, "config_hash": checkpoint.config_hash(older), "config": older}
    checkpoint.validate("ck", meta, now)  # no error
    older["optim"]["lr"] = 0.05  # a key that still counts still refuses
    with pytest.raises(ConfigError, match="optim.lr: 0.05 in the checkpoint vs 0.2 now"):
        checkpoint.validate("ck", meta, now)


@pytest.mark.parametrize("data", ["fashion_mnist", "synthetic"])
def test_a_checkpoint_from_before_datasets_had_a_target_still_resumes(compose_train, data):
    now = checkpoint.config_subset(compose_train([f"data={data}"]))
    old = {**now, "data": {k: v for k, v in now["data"].items() if k not in ("_target_", "task", "seed")},
           "optim": {k: v for k, v in now["optim"].items() if k != "warmup_steps"}}
    old["data"].update(name=data, image_shape=[1, 28, 28], num_classes=10, num_train=60000, num_test=10000)
    meta = {"world_size": 2, "config_hash": "old", "config": old}
    checkpoint.validate("ck", meta, now)  # the same training: no error
    other = checkpoint.config_subset(compose_train(["data=synthetic" if data == "fashion_mnist"
                                                    else "data=fashion_mnist"]))
    with pytest.raises(ConfigError, match="data._target_"):
        checkpoint.validate("ck", meta, other)


# a sync group as checkpoints held it while one group held every strategy's keys (sync.mode named the strategy)
OLD_DILOCO = {"mode": "diloco", "algo": "builtin", "bucket_cap_mb": 25.0, "gradient_as_bucket_view": True,
              "static_graph": False, "compress": "int4", "powersgd_rank": 2, "powersgd_start_step": 100,
              "zero_stage": 1, "shard_units": "auto", "unit_mb": 100.0, "param_dtype": "amp", "reduce_dtype": "fp32",
              "prefetch": True, "every": 4, "local_sgd_start_step": 0, "outer_lr": 0.7, "outer_momentum": 0.5,
              "overlap": 0, "overlap_mix": 0.8, "fragments": 1, "overlap_update": "delayed", "eager_proxy": "local",
              "rounding": "feedback", "islands": "none", "inner": "ddp"}


@pytest.mark.parametrize("overrides,differs", [
    (["sync=diloco", "sync.every=4", "sync.compress=int4"], None),
    (["sync=diloco", "sync.every=8", "sync.compress=int4"], "sync.every: 4 in the checkpoint vs 8 now"),
    (["sync=local_sgd", "sync.every=4"], "sync.options: 'DiLoCoOptions' in the checkpoint vs 'LocalSGDOptions'")])
def test_a_checkpoint_written_with_sync_mode_resumes_as_the_same_strategy(compose_train, overrides, differs):
    now = checkpoint.compat.config_subset(compose_train(overrides))
    meta = {"config": {**now, "sync": OLD_DILOCO}}
    if differs is None:
        checkpoint.compat.validate("step-8", meta, now)
    else:
        with pytest.raises(ConfigError, match=differs):
            checkpoint.compat.validate("step-8", meta, now)
