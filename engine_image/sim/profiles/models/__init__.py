"""Model architecture profiles in Hugging Face ``config.json`` shape plus ``name`` and ``aliases``."""
