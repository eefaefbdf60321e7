"""Which rank of a distributed job tells the job's decisions in its log: rank 0 alone.

Input: the plugin's logger and this process's rank. Output: on every other rank, a filter on that logger that lets
warnings and errors through (what happened to this rank alone) and drops the information lines, which every rank
would print alike (the decisions are taken from summed figures, the same on every rank: docs/plugin/horovod.md).
"""

from __future__ import annotations

import logging


class RankZeroInfo(logging.Filter):
    """Drops the records under WARNING: set on a logger of a rank other than 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def tell_on_rank_zero(logger: logging.Logger, rank: int) -> None:
    """Leaves `logger` as it is on rank 0; on any other rank its information lines are dropped (once per logger)."""
    if rank != 0 and not any(isinstance(f, RankZeroInfo) for f in logger.filters):
        logger.addFilter(RankZeroInfo())
