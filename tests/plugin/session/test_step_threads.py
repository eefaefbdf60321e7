"""StepThreads.take once stitching is over: a run that updates a variable is the step, and nothing of the twin
or the clusters is asked (issue 29: the hook's own cost on a small step once off)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stitchfleet.plugin.session.step_threads import StepThreads


class _Training:
    """Answers the two training-step rules differently, and counts what is asked."""

    def __init__(self, updates: bool) -> None:
        self.updates, self.asked = updates, []

    def updates_variables(self, fetches: Any) -> bool:
        self.asked.append("updates_variables")
        return self.updates

    def is_training(self, fetches: Any) -> bool:
        self.asked.append("is_training")
        return False  # a clusters' rule that would refuse the run

    @property
    def fetched(self) -> list[Any]:
        return []


class _Diverter:
    def diverts(self, *args: Any) -> bool:
        raise AssertionError("the twin is not asked once stitching is over")


def _context() -> Any:
    return SimpleNamespace(original_args=SimpleNamespace(fetches=["train_op"], feed_dict={}), session=None)


def test_before_it_is_over_the_clusters_rule_still_decides() -> None:
    training = _Training(updates=True)
    assert not StepThreads().take(_context(), training, _Diverter())
    assert training.asked == ["is_training"]
