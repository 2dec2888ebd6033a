"""Built-in model and accelerator profiles (JSON data files, one per profile)."""
