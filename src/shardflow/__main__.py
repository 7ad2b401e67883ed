from shardflow.cli import main

main()
