"""Accelerator datasheet profiles: dense BF16 peak, HBM bandwidth, memory, interconnect."""
