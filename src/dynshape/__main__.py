from dynshape.cli.main import main

main()
