from clagd.cli import main

main()
