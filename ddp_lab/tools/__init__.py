"""The tools: benchmarks, the cost model, the emulated cluster, the chapter's baselines, figures, and the
checkpoint consolidator (consolidate.py: any checkpoint's weights as one safetensors file or HF directory).

They use the core (the rest of ddp_lab); the core never imports them.
"""
