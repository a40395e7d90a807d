"""What keeps a run honest: nothing overwritten (rundir), a NaN stops it (divergence),
a hang names the rank (stall), and faults on purpose (faults)."""
