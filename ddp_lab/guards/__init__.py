"""What keeps a run honest: nothing overwritten (rundir), a NaN stops it (divergence), a hang
names the rank (watchdog, a thread beside each rank's training thread, and stall, the lines it
prints), SIGTERM or SIGINT ends with a checkpoint (preemption), and faults on purpose (faults,
injected by the training loop's FaultInjection step callback)."""
