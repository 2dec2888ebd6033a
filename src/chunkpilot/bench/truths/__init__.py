"""Hidden truths for ``chunkpilot bench tuner``: perturbed accelerator profiles (``--truth-family``) and
structural step profiles (``h100-vidur-*``, ``--truth-family structural``; see
:mod:`chunkpilot.bench.structural_truths`)."""
