"""ddp_lab: learn, measure and run data-parallel training in PyTorch."""
