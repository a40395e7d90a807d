"""model.pt laid out from shapes, then filled a tensor at a time: what torch.load reads back is the model."""
import pytest
import torch
from torch import nn

from ddp_lab.models.gpt import gpt
from ddp_lab.training.model_file import ModelFile


def _model():
    torch.manual_seed(0)
    net = gpt(vocab_size=40, block_size=8, n_layer=2, n_head=2, n_embd=16)
    net.norm = nn.BatchNorm1d(3)  # buffers: float and a 0-dim int64
    net.norm.num_batches_tracked += 7
    net.half_head = nn.Linear(4, 4).to(torch.bfloat16)
    return net


def test_filled_in_any_order_it_loads_as_torch_save_wrote_it(tmp_path):
    net = _model()
    state = net.state_dict()
    out = ModelFile(tmp_path / "model.pt", net.state_dict(keep_vars=True))  # (its shapes and dtypes only)
    for name in reversed(list(state)):
        out.put(name, state[name])
    out.finish()
    back = torch.load(tmp_path / "model.pt", weights_only=True)
    assert list(back) == list(state)
    for k in state:
        assert back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]), k
    assert back["lm_head.weight"].data_ptr() == back["wte.weight"].data_ptr()  # tied: one storage, as torch.save
    fresh = _model()
    fresh.load_state_dict(back)  # a plain model takes it


def test_a_tensor_never_written_or_of_another_size_is_refused(tmp_path):
    net = _model()
    out = ModelFile(tmp_path / "model.pt", net.state_dict(keep_vars=True))
    with pytest.raises(ValueError, match=r"^wpe.weight: 4 bytes, 512 laid out$"):
        out.put("wpe.weight", torch.zeros(1))
    with pytest.raises(ValueError, match=r"^never handed out: wte.weight, wpe.weight, blocks.0.ln1.weight$"):
        out.finish()
    out.close()
