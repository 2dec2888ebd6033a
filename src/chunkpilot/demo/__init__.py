"""``chunkpilot demo``: the whole product on one machine."""
