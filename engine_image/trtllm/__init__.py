"""TensorRT-LLM: the option definitions of ``trtllm-serve`` and its LLM-API options file."""
