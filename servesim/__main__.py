from servesim.cli.main import main

main()
