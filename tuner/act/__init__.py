"""Act: carry out a step's plan (the only part of the tuner that writes)."""
