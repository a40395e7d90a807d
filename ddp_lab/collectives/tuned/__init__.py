"""The ring and halving-doubling all-reduces tuned for speed on gloo, and their shared machinery.

Read ddp_lab/collectives/ring_textbook.py and halving_doubling_textbook.py first: these are the
same algorithms with each trick kept for a measured reason (docs/communication.md)."""
