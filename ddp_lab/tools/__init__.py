"""The tools: benchmarks, the cost model, the emulated cluster, the chapter's baselines, figures.

They use the core (the rest of ddp_lab); the core never imports them.
"""
