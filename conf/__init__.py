"""Hydra configs of ddp_lab; shipped inside the package as ddp_lab.conf."""
