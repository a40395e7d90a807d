"""Training: the Trainer and the parts it drives (data, task, optimizer, evaluation, fast path)."""
