"""Built-in model profiles (JSON data files, one per profile) and the loader of model and accelerator
profiles (the accelerator files are the API's, ``chunkpilot.api.accelerators``)."""
