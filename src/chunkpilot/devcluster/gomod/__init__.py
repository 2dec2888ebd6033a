"""Pinned Go build modules (``<component>.mod`` / ``<component>.sum``) for the control-plane binaries.

Each pair is copied into a scratch module directory as ``go.mod`` / ``go.sum`` and the component's
main packages are built from it, so builds are reproducible from the module proxy.
"""
