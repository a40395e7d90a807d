from ddp_lab.costmodel.cli import main

main()
