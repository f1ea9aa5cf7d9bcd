from vitscope.cli.main import app

app(prog_name="vitscope")
