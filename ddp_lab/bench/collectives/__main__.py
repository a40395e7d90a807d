from ddp_lab.bench.collectives.sweep import main

main()
