"""What the cluster's out-of-memory line tells a job to try next: the step after the sync mode it ran."""
import pytest

from ddp_lab.tools.cluster.launch import after_out_of_memory


@pytest.mark.parametrize("overrides,first", [
    ([], "shard the model state (sync=fsdp, or sync=zero sync.zero_stage=3)"),
    (["sync=ddp"], "shard the model state (sync=fsdp, or sync=zero sync.zero_stage=3)"),
    (["sync=zero"], "shard the weights too (sync.zero_stage=3, or sync=fsdp)"),
    (["sync=zero", "sync.zero_stage=2"], "shard the weights too (sync.zero_stage=3, or sync=fsdp)"),
    (["sync=zero", "sync.zero_stage=3"], "sync.overlap_reduce=false (no reduce-scatter held while a unit computes"),
    (["sync=zero", "sync.zero_stage=3", "sync.overlap_reduce=false"], "trainer.activation_checkpointing=units"),
    (["sync=fsdp"], "trainer.activation_checkpointing=units"),
])
def test_the_advice_is_the_next_step_for_the_mode_that_ran(overrides, first):
    said = after_out_of_memory(["-m", "ddp_lab.train", "model=gpt2", *overrides, "data.batch_size=40"])
    assert said.startswith(first), said
    assert "data.batch_size" in said and "more hosts" in said
    if "sync.zero_stage=3" in overrides or overrides == ["sync=fsdp"]:
        assert "shard" not in said  # already sharded: not told to shard
