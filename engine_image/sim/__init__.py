"""CPU engine simulator: vLLM V1 scheduling semantics with a roofline step-time model."""
