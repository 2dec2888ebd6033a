"""Map the repository's top-level folders onto namespaced import packages.

``operator/`` becomes ``chunkpilot.operator`` (never a bare ``operator``, which
would shadow the standard library), ``tuner/`` becomes ``chunkpilot.tuner`` and
``engine_image/`` becomes ``chunkpilot.engine``. Sub-packages are discovered
automatically, so adding a folder with an ``__init__.py`` needs no change here.
"""

from setuptools import find_packages, setup

PACKAGE_ROOTS = {
    "chunkpilot": "src/chunkpilot",
    "chunkpilot.operator": "operator",
    "chunkpilot.tuner": "tuner",
    "chunkpilot.engine": "engine_image",
}


def _packages() -> list[str]:
    names: list[str] = []
    for package, folder in PACKAGE_ROOTS.items():
        names.append(package)
        names.extend(f"{package}.{sub}" for sub in find_packages(folder))
    return names


setup(packages=_packages(), package_dir=PACKAGE_ROOTS)
