from kvcli.cli import main

main()
