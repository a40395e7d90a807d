import sys

from ddp_lab.tools.bench.vs_baseline.compare import main

sys.exit(main())
