"""The networks ddp_lab trains. Each is built from config: conf/model/<name>.yaml
names its function with `_target_`, so a new model is a function plus a YAML file.

    lenet.py       the d2l multi-GPU chapter's LeNet, as the chapter wrote it (model=lenet)
    lenet_fast.py  the same function of the same weights, reshaped for less arithmetic
                   and for torch.compile's CPU kernels (model=lenet_fast)
    resnet.py      d2l's small-image ResNet-18 (model=resnet18)
    gpt.py         a small decoder-only transformer, after nanoGPT (model=gpt, gpt_small, gpt2)
    build.py       building a model from its config; init, SyncBatchNorm; sizes; whether it fits the data
    calling.py     calling a model on a batch and reading its output (a Hugging Face model's own loss)
    meta_init.py   building a model a unit at a time on the meta device (zero stage 3, fsdp)
"""
from ddp_lab.models.build import (
    build_model,
    check_fits_data,
    check_sync_bn,
    check_takes_dicts,
    finish,
    gradient_bytes,
    load_model_config,
    model_name,
    num_parameters,
)

__all__ = ["build_model", "check_fits_data", "check_sync_bn", "check_takes_dicts", "finish", "gradient_bytes",
           "load_model_config", "model_name", "num_parameters"]
