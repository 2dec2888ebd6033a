"""Workload traces bundled with the simulator (see README.md in this folder for sources and licences)."""
