from aivedio_cli.main import run

run()
