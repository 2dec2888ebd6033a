"""SGLang: the cached environment with its own argument parser, and the check run inside it."""
