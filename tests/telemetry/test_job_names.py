"""An empty STITCHFLEET_JOB_NAME stands for the script's name, as the settings document (issue 30 item 5).

Regression: every job was booked as job name "job", so the weekly report could not tell jobs apart.
"""

from __future__ import annotations

import pytest

from stitchfleet import settings
from stitchfleet.telemetry.rows import JobKey, script_job_name


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/work/jobs/train_mnist.py", "train_mnist"),
        ("run_classifier.py", "run_classifier"),
        ("/usr/local/bin/horovodrun-worker", "horovodrun-worker"),
        ("-c", "python"),
        ("", "python"),
    ],
)
def test_the_script_names_the_job(argv0: str, name: str) -> None:
    assert script_job_name(argv0) == name


def test_an_empty_job_name_is_derived_and_a_set_one_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["/jobs/word2vec_basic.py", "--steps", "10"])
    derived = JobKey.from_settings(settings.load({"STITCHFLEET_JOB_NAME": ""}), "uid-1")
    assert derived.job_name == "word2vec_basic"
    kept = JobKey.from_settings(settings.load({"STITCHFLEET_JOB_NAME": "bert-finetune"}), "uid-1")
    assert kept.job_name == "bert-finetune"
