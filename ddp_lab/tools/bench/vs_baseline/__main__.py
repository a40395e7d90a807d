import sys

from ddp_lab.tools.bench.vs_baseline.cli import main

sys.exit(main())
