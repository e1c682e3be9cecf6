from raysweep.cli import main

main()
