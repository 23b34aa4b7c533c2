from tracebench.cli import main

main()
