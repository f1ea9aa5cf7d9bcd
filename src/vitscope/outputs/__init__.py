"""One writer for every command: results.json, CSV tables, large arrays, figures and report.html, atomically."""

from vitscope.outputs.folder import OutputError, prepare_output
from vitscope.outputs.run_result import RunResult
from vitscope.outputs.writer import write_run

__all__ = ["OutputError", "RunResult", "prepare_output", "write_run"]
