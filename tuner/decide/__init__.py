"""Decide: from one snapshot, the plan of one step (pure: no I/O, nothing written)."""
