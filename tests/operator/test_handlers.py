"""The operator's Kopf handlers: which changes of a service they react to (pure filters)."""

from __future__ import annotations

from typing import Any

from chunkpilot.operator.handlers import pool_decisions_changed


def body(*pools: tuple[str, int], reason: str = "") -> dict[str, Any]:
    """A service whose planner decided ``pools`` (role, replicas), each with ``reason``."""
    decided = [{"role": r, "desiredReplicas": n, "reason": reason, "recommendations": []} for r, n in pools]
    return {
        "spec": {},
        "status": {"scaling": {"desiredReplicas": sum(n for _, n in pools), "pools": decided}},
    }


def test_a_new_split_of_the_same_replicas_is_a_change_a_rewritten_reason_is_not() -> None:
    before = body(("prefill", 2), ("decode", 1))
    assert pool_decisions_changed(old=before, new=body(("prefill", 1), ("decode", 2)))  # the sum is 3 both
    assert not pool_decisions_changed(old=before, new=body(("prefill", 2), ("decode", 1), reason="again"))
    assert pool_decisions_changed(old={"spec": {}}, new=before)  # the first decision
    assert not pool_decisions_changed(old=None, new={"spec": {}})
