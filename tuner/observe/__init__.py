"""Observe: read everything a tuning step decides from into one frozen snapshot (reads only)."""
