"""Reference measurements and fitted efficiency constants of the step-time model."""
