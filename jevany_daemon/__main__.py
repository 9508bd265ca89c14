from jevany_daemon.cli import main

main()
