from ddops.cli.app import main

main()
