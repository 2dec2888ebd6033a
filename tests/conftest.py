"""Shared pytest plugins for the whole test suite."""

pytest_plugins = ["chunkpilot.devcluster.fixtures", "chunkpilot.localrun.fixtures"]
