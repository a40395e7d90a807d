"""Run ddp_lab.train with one part of the new step swapped out, to find what costs time.
usage: torchrun ... _gpu/variant.py VARIANT [overrides]; VARIANT: after | sync-timer | no-gradcheck"""
import runpy
import sys

import torch

variant = sys.argv.pop(1)
if variant in ("data-sync", "all-syncs"):  # the data wait timed with a synchronize on each side, as before
    from ddp_lab import trainer

    class SyncedTime:
        @staticmethod
        def perf_counter():
            torch.cuda.synchronize()
            import time
            return time.perf_counter()
    trainer.time = SyncedTime
if variant in ("sync-timer", "all-syncs"):  # the step timer as before: host clock, a synchronize per step
    from ddp_lab import stragglers
    init = stragglers.StepTimer.__init__

    def __init__(self, model, env):
        init(self, model, env)
        self.cuda = False
    synced = stragglers.StepTimer.synced

    def synced_after_sync(self):
        torch.cuda.synchronize()
        synced(self)
    stragglers.StepTimer.__init__, stragglers.StepTimer.synced = __init__, synced_after_sync
elif variant == "no-gradcheck":  # judge by the loss, as before (no gradient sum)
    from ddp_lab import divergence
    init = divergence.LossWatch.__init__

    def __init__(self, env, every, lr, amp, params=None):
        init(self, env, every, lr, amp, None)
    divergence.LossWatch.__init__ = __init__
sys.argv[0] = "ddp_lab.train"
runpy.run_module("ddp_lab.train", run_name="__main__", alter_sys=True)
