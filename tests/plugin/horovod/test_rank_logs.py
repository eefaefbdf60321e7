"""rank_logs: rank 0 alone tells the job's decisions; every rank still tells its own warnings and errors."""

from __future__ import annotations

import logging

import pytest

from stitchfleet.plugin.horovod.rank_logs import RankZeroInfo, tell_on_rank_zero


@pytest.fixture
def logger() -> logging.Logger:
    made = logging.getLogger("stitchfleet.test-rank-logs")
    made.filters.clear()
    return made


def test_another_rank_drops_information_and_keeps_warnings(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    tell_on_rank_zero(logger, 1)
    tell_on_rank_zero(logger, 1)  # a second hook in the process adds no second filter
    assert sum(isinstance(f, RankZeroInfo) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("stitchfleet: group proven at step 94")
        logger.warning("stitchfleet: this rank's compile failed")
    assert [r.getMessage() for r in caplog.records] == ["stitchfleet: this rank's compile failed"]


def test_rank_zero_tells_everything(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    tell_on_rank_zero(logger, 0)
    assert logger.filters == []
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("stitchfleet: group proven at step 94")
    assert [r.getMessage() for r in caplog.records] == ["stitchfleet: group proven at step 94"]
