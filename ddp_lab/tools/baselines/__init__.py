"""The d2l multi-GPU chapter's two systems, as runnable baselines."""
