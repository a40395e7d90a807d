"""A Hugging Face transformers model as it is (models/hf.py, models/calling.py, checkpoint/pretrained.py): its
forward takes dict batches by keyword, its own loss trains it and its logits give exact held-out sums; its
init replays a module at a time; pretrained weights load by name, checked; the run's weights leave as
safetensors. Tiny GPT-2, Llama and BERT built from their config classes: nothing is downloaded."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from ddp_lab.checkpoint.pretrained import PretrainedWeights, load_whole
from ddp_lab.config import ConfigError
from ddp_lab.datasets.keyed import collate
from ddp_lab.models.calling import check_takes_keys, loss_and_logits, shifts_labels
from ddp_lab.models.meta_init import MetaInit, build_on_meta, materialise_whole, reinitialise_whole
from ddp_lab.training.safetensors_file import SafetensorsFile
from ddp_lab.training.tasks import CLASSIFICATION, LANGUAGE_MODEL

transformers = pytest.importorskip("transformers")
from ddp_lab.models.hf import transformers_model  # noqa: E402

GPT2 = ("gpt2", "causal_lm", dict(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                  bos_token_id=0, eos_token_id=0))
LLAMA = ("llama", "causal_lm", dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, bos_token_id=0,
                                    eos_token_id=0, pad_token_id=0))
BERT = ("bert", "sequence_classification", dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                                num_attention_heads=2, vocab_size=64, num_labels=3,
                                                max_position_embeddings=32))
MODELS = {"gpt2": GPT2, "llama": LLAMA, "bert": BERT}


def _padded_batch(vocab: int = 64) -> dict:
    """Three documents of 9, 5 and 7 tokens, padded by collate (labels -100, attention_mask 0)."""
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, vocab, (n,), generator=g) for n in (9, 5, 7)]
    return collate([{"input_ids": d, "attention_mask": torch.ones_like(d), "labels": d.clone()} for d in docs])


def test_collate_pads_each_key_as_transformers_does():
    batch = _padded_batch()
    assert batch["input_ids"].shape == (3, 9)
    assert batch["labels"][1].tolist()[5:] == [-100] * 4 and batch["attention_mask"][1].tolist() == [1] * 5 + [0] * 4
    assert batch["input_ids"][1].tolist()[5:] == [0] * 4


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_models_own_loss_trains_and_its_sums_count_the_labels_it_scores(name):
    torch.manual_seed(0)
    model = transformers_model(*MODELS[name])
    batch = _padded_batch()
    task = LANGUAGE_MODEL.__class__(**{**LANGUAGE_MODEL.__dict__, "own_loss": True, "shift": shifts_labels(model)})
    out = model(**batch)
    loss = task.loss(out, batch["labels"])
    assert loss is out.loss  # its own loss, as it is
    sums = torch.zeros(3, dtype=torch.float64)
    task.accumulate(sums, loss, out, batch["labels"])
    scored = (9 - 1) + (5 - 1) + (7 - 1)  # shifted by one inside a causal LM; padding (-100) not counted
    assert int(sums[2]) == scored
    logits, labels = out.logits[:, :-1], batch["labels"][:, 1:]
    by_hand = nn.functional.cross_entropy(logits.reshape(-1, 64).float(), labels.reshape(-1), reduction="sum")
    assert float(sums[0]) == pytest.approx(by_hand.item(), rel=1e-5)  # exact sums: mean x count = the sum
    correct = ((logits.argmax(-1) == labels) & (labels != -100)).sum()
    assert int(sums[1]) == int(correct)


def test_a_sequence_classifier_counts_one_label_a_sample():
    torch.manual_seed(0)
    model = transformers_model(*BERT)
    assert not shifts_labels(model)
    batch = {"input_ids": torch.randint(1, 64, (4, 6)), "labels": torch.tensor([0, 2, 1, 2])}
    task = CLASSIFICATION.__class__(**{**CLASSIFICATION.__dict__, "own_loss": True})
    out = model(**batch)
    sums = torch.zeros(3, dtype=torch.float64)
    task.accumulate(sums, task.loss(out, batch["labels"]), out, batch["labels"])
    assert int(sums[2]) == 4 and int(sums[1]) == int((out.logits.argmax(-1) == batch["labels"]).sum())
    assert float(sums[0]) == pytest.approx(4 * out.loss.item(), rel=1e-6)


def test_an_output_without_loss_or_logits_is_one_line():
    with pytest.raises(ConfigError) as e:
        loss_and_logits({"hidden": torch.zeros(1)})
    assert str(e.value) == ("the model's forward returned a dict with keys hidden: ddp_lab needs a loss (.loss or "
                            "['loss'], given labels) or logits (.logits or ['logits']), or a tensor of logits")
    assert loss_and_logits(torch.ones(2))[1] is not None  # a tensor is its logits


def test_a_model_whose_output_has_no_loss_or_logits_is_refused_before_the_first_step():
    from omegaconf import OmegaConf

    from ddp_lab.models.build import check_takes_dicts
    sample = {"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([1, 2, 3])}
    with pytest.raises(ConfigError, match=r"^the model.s forward returned a dict with keys hidden: ddp_lab needs"):
        check_takes_dicts(OmegaConf.create({"_target_": "tests.workloads.hidden_states_only"}), sample)
    gpt2 = OmegaConf.create({"_target_": "ddp_lab.models.hf.transformers_model", "config": "gpt2",
                             "overrides": GPT2[2]})
    assert check_takes_dicts(gpt2, sample) is True  # (its own loss shifts the labels: a causal LM)


def test_its_flops_are_counted_as_a_real_step_counts_them():
    """On fake tensors (its forward reads its masks' values, which it skips there), the count of a real step."""
    from torch.utils.flop_counter import FlopCounterMode

    from ddp_lab.telemetry.mfu import train_flops_per_sample
    model = transformers_model(*GPT2)
    sample = {"input_ids": torch.arange(1, 17), "attention_mask": torch.ones(16, dtype=torch.long),
              "labels": torch.arange(1, 17)}
    with FlopCounterMode(display=False) as real:
        model(**{k: v.repeat(2, 1) for k, v in sample.items()}).loss.backward()
    assert train_flops_per_sample(model, sample) == real.get_total_flops() // 2


def test_a_key_the_forward_does_not_take_is_one_line():
    model = transformers_model(*GPT2)
    check_takes_keys(model, ["input_ids", "attention_mask", "labels"], "hf_gpt2")
    with pytest.raises(ConfigError, match=r"^the data's samples are dicts with key\(s\) text that model=hf_gpt2's "
                                          r"forward does not take \(it takes input_ids, "):
        check_takes_keys(model, ["input_ids", "text", "labels"], "hf_gpt2")


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_a_meta_build_gives_the_weights_every_sync_mode_starts_from(name):
    """Built a unit at a time (zero stage 3, fsdp) or whole (ddp, re-initialised), the same weights at the
    same seed: the model's own _init_weights, module by module; buffers (rotary, position ids) filled."""
    torch.manual_seed(7)
    model, why = build_on_meta(lambda: transformers_model(*MODELS[name]))
    assert why == ""
    materialise_whole(model, MetaInit(model))
    whole = transformers_model(*MODELS[name])
    reinitialise_whole(whole, 7)
    for (n, a), (_, b) in zip([*model.named_parameters(), *model.named_buffers()],
                              [*whole.named_parameters(), *whole.named_buffers()]):
        assert torch.equal(a, b), n
    std = model.get_input_embeddings().weight.std().item()
    assert 0.015 < std < 0.025  # its config's initializer_range (0.02), not torch's defaults


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(3)
    model = transformers_model(*GPT2)
    model.save_pretrained(tmp_path / "gpt2")
    return model, tmp_path / "gpt2"


def test_pretrained_weights_load_from_a_directory_a_file_or_a_state_dict(saved, tmp_path):
    source, directory = saved
    torch.save({f"module.{k}": v for k, v in source.state_dict().items()}, tmp_path / "ddp.pt")  # DDP's prefix
    for path in (directory, directory / "model.safetensors", tmp_path / "ddp.pt"):
        torch.manual_seed(0)
        model = transformers_model(*GPT2)
        assert load_whole(model, str(path)) == sum(1 for _ in model.parameters())
        for (n, a), b in zip(model.state_dict().items(), source.state_dict().values()):
            assert torch.equal(a, b), (path, n)
        assert model.lm_head.weight is model.transformer.wte.weight  # still tied


def test_sharded_save_pretrained_directories_load(saved, tmp_path):
    source, _ = saved
    source.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model = transformers_model(*GPT2)
    load_whole(model, str(tmp_path / "sharded"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))


def test_weights_that_do_not_fit_are_one_line_each(saved, tmp_path):
    _, directory = saved
    llama = transformers_model(*LLAMA)
    with pytest.raises(ConfigError, match=r"holds none of the model's weights \(model.embed_tokens.weight, .* "
                                          r"missing; it holds transformer\.h\.0\.attn.*\): is it another model's\?$"):
        PretrainedWeights(directory).match(llama)
    wider = transformers_model("gpt2", "causal_lm", {**GPT2[2], "n_embd": 64})
    with pytest.raises(ConfigError, match=r"does not fit the model: shape mismatch transformer.wte.weight \[64, 32\] "
                                          r"\(the model's \[64, 64\]\), "):
        PretrainedWeights(directory).match(wider)
    deeper = transformers_model("gpt2", "causal_lm", {**GPT2[2], "n_layer": 3})
    with pytest.raises(ConfigError, match=r"does not fit the model: missing 12: transformer.h.2.ln_1.weight, "):
        PretrainedWeights(directory).match(deeper)
    shallower = transformers_model("gpt2", "causal_lm", {**GPT2[2], "n_layer": 1})
    # (11 of block 1's 12: GPT-2's own _keys_to_ignore_on_load_unexpected, "attn.bias", matches c_attn.bias too)
    with pytest.raises(ConfigError, match=r"does not fit the model: unexpected 11: transformer.h.1."):
        PretrainedWeights(directory).match(shallower)
    with pytest.raises(ConfigError, match=r"^model.pretrained=/no/such does not exist: point it at a .safetensors"):
        PretrainedWeights("/no/such")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no model.safetensors, model.safetensors.index.json or "):
        PretrainedWeights(tmp_path / "empty")
    (tmp_path / "junk.safetensors").write_bytes(b"not weights")
    with pytest.raises(ConfigError, match=r"junk.safetensors cannot be read as weights: "):
        PretrainedWeights(tmp_path / "junk.safetensors")


def test_safetensors_written_a_tensor_at_a_time_load_as_save_file_wrote_them(tmp_path):
    from safetensors.torch import load_file
    torch.manual_seed(0)
    model = transformers_model(*GPT2)
    state = model.state_dict(keep_vars=True)
    out = SafetensorsFile(tmp_path / "m.safetensors", state)
    for name, t in reversed(list(model.state_dict().items())):  # any order
        out.put(name, t)
    out.finish()
    back = load_file(tmp_path / "m.safetensors")
    assert "lm_head.weight" not in back  # tied: once, under its first name, as save_pretrained writes it
    assert set(back) == set(state) - {"lm_head.weight"}
    assert all(torch.equal(back[k], state[k]) for k in back)
    header = json.loads((tmp_path / "m.safetensors").read_bytes()[8:8 + int.from_bytes(
        (tmp_path / "m.safetensors").read_bytes()[:8], "little")])
    assert header["__metadata__"] == {"format": "pt"}
    (tmp_path / "hf").mkdir()
    model.config.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").write_bytes((tmp_path / "m.safetensors").read_bytes())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
