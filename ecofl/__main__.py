from ecofl.cli import run

run()
