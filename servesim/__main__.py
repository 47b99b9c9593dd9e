from servesim.cli import main

main()
