from ddp_lab.tools.costmodel.cli import main

main()
