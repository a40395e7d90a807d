"""A ddp_lab user project: its own model and dataset, launched by ddp_lab.train."""
