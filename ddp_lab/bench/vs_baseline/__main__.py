import sys

from ddp_lab.bench.vs_baseline.cli import main

sys.exit(main())
