from jevany_daemon.cli import app

app(prog_name="jevany-daemon")
