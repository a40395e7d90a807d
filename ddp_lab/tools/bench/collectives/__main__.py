from ddp_lab.tools.bench.collectives.sweep import main

main()
