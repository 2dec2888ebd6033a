"""Trial-history reports: a table and PNG plots built from TuningTrial objects."""

from chunkpilot.report.history import TrialRow, load_history, trial_rows
from chunkpilot.report.render import render_markdown, render_table, write_report

__all__ = ["TrialRow", "load_history", "render_markdown", "render_table", "trial_rows", "write_report"]
