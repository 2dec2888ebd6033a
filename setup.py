"""Map the repository's top-level folders onto namespaced import packages.

``operator/`` becomes ``chunkpilot.operator`` (never a bare ``operator``, which
would shadow the standard library), ``tuner/`` becomes ``chunkpilot.tuner`` and
``engine_image/`` becomes ``chunkpilot.engine``. Sub-packages are discovered
automatically, so adding a folder with an ``__init__.py`` needs no change here.

Editable installs are always *strict* (a tree of links under ``build/``): the
default "lenient" mode's import finder cannot place ``chunkpilot.operator``
(a folder outside ``src/chunkpilot`` without an ``__init__.py``) under
``chunkpilot``, so ``pip install -e .`` would install a command that fails with
``No module named 'chunkpilot.operator'``. Re-run the install after adding a module.
"""

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel
from setuptools.errors import OptionError

PACKAGE_ROOTS = {
    "chunkpilot": "src/chunkpilot",
    "chunkpilot.operator": "operator",
    "chunkpilot.tuner": "tuner",
    "chunkpilot.engine": "engine_image",
}
STRICT = "strict"


def _packages() -> list[str]:
    names: list[str] = []
    for package, folder in PACKAGE_ROOTS.items():
        names.append(package)
        names.extend(f"{package}.{sub}" for sub in find_packages(folder))
    return names


class StrictEditableWheel(editable_wheel):
    """``pip install -e .`` builds a strict editable wheel unless told otherwise, and refuses the rest."""

    def finalize_options(self) -> None:
        super().finalize_options()
        mode = (self.mode or STRICT).lower()
        if mode != STRICT:
            raise OptionError(
                f"editable mode {mode!r} cannot map operator/, tuner/ and engine_image/ onto "
                "chunkpilot.operator, chunkpilot.tuner and chunkpilot.engine: run "
                "`pip install -e .` (strict is this project's default) or pass "
                "`--config-settings editable_mode=strict`; re-run it after adding a module"
            )
        self.mode = STRICT


setup(
    packages=_packages(),
    package_dir=PACKAGE_ROOTS,
    cmdclass={"editable_wheel": StrictEditableWheel},
)
