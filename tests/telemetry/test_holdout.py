"""The held-out check on a store filled with rows, its figures worked out by hand (week 2026-W47: Nov 16-22).

Job vision/resnet-h (gpu-east, 1 rank x 2 GPUs each run):
- H1, H2: holdout runs (a setup event with HOLDOUT_REASON), windows (100 steps, 100 p s) and (50 steps, 50 p s),
  so each run's mean step is its p (the main case: 0.102 and 0.098, m 0.100, sd 0.002 sqrt 2).
- H4: a holdout run of the same job in W46 (mean step 0.5): another week, it does not count.
- S1: stitched, started in W47, compile 20 s and plugin overhead 5 s (charged to W47); a baseline window (100 steps,
  11 s) and three paired stitched windows (100 steps, 9 s, saving 2 s each: claimed 6 s, windows agreeing exactly).
- S2: as S1 but started in W46 with a 30 s compile, charged to W46: nothing charged in W47; one more stitched
  window in W48, not this week's.
- S3: started in W47, nothing charged; a warmup (100, 12 s), a baseline (100, 11 s) and two paired stitched windows
  (100, 9 s, saving 2 s): too few paired windows for an interval, it claims 0.
- S5: stitched, of the same job in W48 only: another week.
So the week's stitched runs have I_t = 400 each (1200), S_t = 38 + 25, 38, 41 (142 rank-seconds), claim 12 rank-s.
Job vision/other-j (1 rank x 1 GPU): H3, a holdout in W47 (another job: does not count for resnet-h, and alone is
no check), and O1, stitched in W47: three paired windows (100, 9 s, saving 3 s): claims 9 s, unchecked.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import math
from pathlib import Path

import pytest

from stitchfleet import cli
from stitchfleet.telemetry import database, holdout, report_command, report_html, report_text, savings
from stitchfleet.telemetry import rows as r
from stitchfleet.telemetry.kinds import HOLDOUT_REASON
from tests.telemetry import workload

H = 3600.0
T1 = 12.706  # Student's t, 97.5%, one degree of freedom (two holdouts)
JOB, OTHER = "resnet-h", "other-j"


def at(day: int, hour: int) -> dt.datetime:
    return dt.datetime(2026, 11, day, hour, tzinfo=dt.UTC)


def key(name: str, uid: str) -> r.JobKey:
    return r.JobKey("gpu-east", "vision", name, uid)


def started(job: r.JobKey, when: dt.datetime, per_rank: int = 2, kind: str = "gpu") -> r.JobStarted:
    return r.JobStarted(
        job, 0, "ml", "resnet", "pod-0", 1, per_rank, "H200", when, device_kind=kind, devices_per_rank=per_rank
    )


def window(job: r.JobKey, index: int, when: dt.datetime, figures: tuple[int, float, float], mode: str) -> r.StepWindow:
    """Window `index` of rank 0: (iterations, step seconds, saved seconds); stitched windows carry a reference."""
    steps, seconds, saved = figures
    reference = 0.11 if mode == "stitched" else None
    first = index * 1000
    return r.StepWindow(job, 0, index, first, first + steps - 1, steps, mode, seconds, reference, saved, when)


def holdout_run(job: r.JobKey, day: int, plain: float, per_rank: int = 2) -> list[r.Row]:
    event = r.Event(
        job, "setup", reason=HOLDOUT_REASON, detail="run 10 of every 10 runs as written", occurred_at=at(day, 1)
    )
    return [
        started(job, at(day, 1), per_rank),
        event,
        window(job, 0, at(day, 2), (100, 100 * plain, 0.0), "baseline"),
        window(job, 1, at(day, 3), (50, 50 * plain, 0.0), "baseline"),
        r.JobFinished(job, "finished", ended_at=at(day, 4)),
    ]


def stitched_run(job: r.JobKey, day: int, paired_windows: int, saved: float = 2.0) -> list[r.Row]:
    rows: list[r.Row] = [window(job, 0, at(day, 5), (100, 11.0, 0.0), "baseline")]
    for index in range(1, paired_windows + 1):
        rows.append(window(job, index, at(day, 5 + index), (100, 9.0, saved), "stitched"))
    return rows


def fleet(plain: tuple[float, float] = (0.102, 0.098)) -> list[r.Row]:
    s1, s2, s3, s5 = (key(JOB, uid) for uid in ("s1", "s2", "s3", "s5"))
    rows = holdout_run(key(JOB, "h1"), 17, plain[0]) + holdout_run(key(JOB, "h2"), 18, plain[1])
    rows += holdout_run(key(JOB, "h4"), 10, 0.5) + holdout_run(key(OTHER, "h3"), 18, 0.2, per_rank=1)
    rows += [started(s1, at(17, 4)), r.JobCompiled(s1, 0, 20.0), r.JobOverhead(s1, 0, 5.0), *stitched_run(s1, 17, 3)]
    rows += [started(s2, at(12, 4)), r.JobCompiled(s2, 0, 30.0), *stitched_run(s2, 18, 3)]
    rows.append(window(s2, 7, at(23, 1), (100, 9.0, 2.0), "stitched"))  # the next week's (Monday 01:00)
    rows += [started(s3, at(19, 4)), window(s3, 9, at(19, 4), (100, 12.0, 0.0), "warmup"), *stitched_run(s3, 19, 2)]
    rows += [started(s5, at(24, 4)), *stitched_run(s5, 24, 3)]
    o1 = key(OTHER, "o1")
    return [*rows, started(o1, at(20, 4), per_rank=1), *stitched_run(o1, 20, 3, saved=3.0)]


def write(url: str, rows: list[r.Row]) -> None:
    database.upgrade(url)
    workload.write(url, rows)


def test_the_check_of_a_job_figured_by_hand(any_url: str) -> None:
    write(any_url, fleet())
    report = savings.weekly_summary(any_url, "2026-W47")
    assert [(c.job_name, c.device_kind) for c in report.held_out] == [(JOB, "gpu")]  # other-j: one holdout, no check
    check = report.held_out[0]
    # H1: (10.2 + 5.1) / 150 = 0.102, H2 0.098 (H4 of W46 and H3 of other-j left out): m 0.100, sd 0.002 sqrt 2.
    sd = 0.002 * math.sqrt(2.0)
    assert (check.cluster, check.namespace, check.holdout_runs, check.stitched_runs) == ("gpu-east", "vision", 2, 3)
    assert check.plain_step_seconds == pytest.approx(0.100, rel=1e-12)
    assert check.plain_step_sd == pytest.approx(sd, rel=1e-9)
    # S1, S2, S3 (S5 is W48's): 1200 rank-steps, 38 + 38 + 41 = 117 s of steps, 25 s charged (S1's compile and
    # overhead; S2's compile went to W46).
    assert check.stitched_rank_steps == 1200
    assert check.stitched_step_seconds == pytest.approx(117 / 1200, rel=1e-12)
    assert check.charged_seconds == pytest.approx(25.0, rel=1e-12)
    saving = 0.100 * 1200 - (117 + 25)  # -22 rank-seconds
    half = T1 * sd * math.sqrt(1200**2 / 2 + 3 * 400**2)  # about 39.4
    assert check.saving_hours == pytest.approx(saving * 2 / H, rel=1e-9)
    assert check.low_hours == pytest.approx((saving - half) * 2 / H, rel=1e-9)
    assert check.high_hours == pytest.approx((saving + half) * 2 / H, rel=1e-9)
    assert check.claimed_hours == pytest.approx(12 * 2 / H, rel=1e-12)  # S1 6 s + S2 6 s + S3 0, x 2 GPUs
    assert check.charged_hours == pytest.approx(25 * 2 / H, rel=1e-12)
    assert check.in_job_net_hours == pytest.approx(-26 / H, rel=1e-12)
    assert check.verdict == "within"  # the in-job net, -26 GPU-seconds, inside (-122.7, 34.7)

    # The report's own figures do not move: S1 and S2 claim 12 GPU-s each, O1 9; the check keeps the net.
    gpu = report.totals.gpu
    assert gpu.gross_hours == pytest.approx(33 / H, rel=1e-12)
    after = report.net_after_check("gpu")
    assert (after.checked_jobs, after.net_hours) == (1, gpu.net_hours)
    assert after.after_check_hours == pytest.approx(gpu.net_hours, rel=1e-12)


@pytest.mark.parametrize(
    ("plain", "verdict", "m"),
    [
        ((0.1001, 0.0999), "above", 0.100),  # saving -22 +- 1.97 rank-s; the in-job net, 12 - 25 = -13, is above
        ((0.1311, 0.1309), "below", 0.131),  # saving 157.2 - 142 = 15.2 +- 1.97; the net, -13, is below
    ],
)
def test_the_claim_above_or_below_the_interval(
    sqlite_url: str, plain: tuple[float, float], verdict: str, m: float
) -> None:
    write(sqlite_url, fleet(plain))
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    (check,) = report.held_out
    half = T1 * (0.0001 * math.sqrt(2.0)) * math.sqrt(1200**2 / 2 + 3 * 400**2)
    high = m * 1200 - 142 + half
    assert check.verdict == verdict
    assert check.high_hours == pytest.approx(high * 2 / H, rel=1e-6)
    # After the check: the net less what the job's in-job net (24 - 50 GPU-s) books above its high end.
    excess = max(-26.0 - high * 2, 0.0)
    assert (excess > 0) == (verdict == "above")
    net = report.totals.gpu.net_hours
    assert report.net_after_check("gpu").after_check_hours == pytest.approx(net - excess / H, rel=1e-6)
    assert report.totals.gpu.gross_hours == pytest.approx(33 / H, rel=1e-12)  # the gross as before


def test_one_holdout_in_the_week_gives_no_check(sqlite_url: str) -> None:
    # H2 gone: H1 is the job's only holdout in W47 (H4 is of W46, H3 of other-j).
    rows = [row for row in fleet() if getattr(row, "job", None) != key(JOB, "h2")]
    write(sqlite_url, rows)
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    assert report.held_out == ()
    after = report.net_after_check("gpu")
    assert (after.checked_jobs, after.after_check_hours) == (0, pytest.approx(report.totals.gpu.net_hours))


def test_holdouts_of_another_week_or_kind_do_not_count(sqlite_url: str) -> None:
    # Two more holdouts named resnet-h: H6 in W48 (mean 0.3), and H8 in W47 but a CPU task (mean 0.9): the CPU
    # job is another job for the check (one holdout: none), the GPU job keeps H1 and H2 only.
    # S8, a CPU stitched run of the same name, is the CPU job's, not the GPU job's.
    cpu = [started(key(JOB, "h8"), at(19, 1), kind="cpu"), *holdout_run(key(JOB, "h8"), 19, 0.9)[1:]]
    cpu += [started(key(JOB, "s8"), at(19, 1), kind="cpu"), *stitched_run(key(JOB, "s8"), 19, 3)]
    write(sqlite_url, fleet() + holdout_run(key(JOB, "h6"), 24, 0.3) + cpu)
    (check,) = savings.weekly_summary(sqlite_url, "2026-W47").held_out
    assert (check.device_kind, check.holdout_runs, check.stitched_runs, check.stitched_rank_steps) == (
        "gpu",
        2,
        3,
        1200,
    )
    assert check.plain_step_seconds == pytest.approx(0.100, rel=1e-12)
    # W48 holds H6 and S5 only: one holdout, no check.
    assert savings.weekly_summary(sqlite_url, "2026-W48").held_out == ()


def test_the_stitched_runs_are_the_jobs_own_and_never_a_holdout(sqlite_url: str) -> None:
    # H9: a third holdout of resnet-h in W47 that also recorded a stitched window (mean step over its windows
    # (10 + 5 + 10) / 250 = 0.1): a holdout, never a stitched run. O1 (other-j) is not resnet-h's either: its 9 s
    # claim stays out of the job's claim.
    h9 = key(JOB, "h9")
    odd = [*holdout_run(h9, 19, 0.1), window(h9, 2, at(19, 4), (100, 10.0, 0.0), "stitched")]
    write(sqlite_url, fleet() + odd)
    (check,) = savings.weekly_summary(sqlite_url, "2026-W47").held_out
    assert (check.holdout_runs, check.stitched_runs, check.stitched_rank_steps) == (3, 3, 1200)
    assert check.plain_step_seconds == pytest.approx(0.100, rel=1e-12)
    assert check.plain_step_sd == pytest.approx(0.002, rel=1e-9)  # deviations 0.002, -0.002, 0 over k - 1 = 2
    assert check.claimed_hours == pytest.approx(24 / H, rel=1e-12)


def test_check_job_by_hand_and_its_errors() -> None:
    job = holdout.JobName("c", "ns", "j", "cpu")
    runs = [holdout.StitchedRun(1, 4, 100, 8.0, 1.0, 3.0), holdout.StitchedRun(2, 4, 300, 24.0, 0.0, 0.0)]
    check = holdout.check_job(job, [0.1, 0.12, 0.11], runs)
    # m 0.11, sd 0.01, k 3 (t 4.303); device-seconds: 4 x (0.11 x 100 - 9) + 4 x (0.11 x 300 - 24) = 8 + 36 = 44.
    assert check.saving_hours == pytest.approx(44 / H, rel=1e-9)
    half = 4.303 * 0.01 * math.sqrt(1600**2 / 3 + 400**2 + 1200**2)
    assert check.high_hours - check.saving_hours == pytest.approx(half / H, rel=1e-9)
    assert check.claimed_hours == pytest.approx(12 / H, rel=1e-12)
    assert check.charged_hours == pytest.approx(4 / H, rel=1e-12)  # run 1's 1 rank-s x 4 devices
    assert check.verdict == "within"  # the in-job net, 12 - 4 device-s, inside 44 +- 67.4
    assert check.stitched_step_seconds == pytest.approx(32 / 400, rel=1e-12)
    with pytest.raises(ValueError, match=r"ns/j .*: 1 holdout runs, expected >= 2"):
        holdout.check_job(job, [0.1], runs)
    with pytest.raises(ValueError, match="no stitched run"):
        holdout.check_job(job, [0.1, 0.2], [])
    with pytest.raises(ValueError, match="holdout mean step nan"):
        holdout.check_job(job, [0.1, math.nan], runs)
    with pytest.raises(ValueError, match="task 1 has rank_steps=0"):
        holdout.check_job(job, [0.1, 0.2], [dataclasses.replace(runs[0], rank_steps=0)])


@pytest.mark.parametrize(
    ("claimed", "verdict"), [(1.0, "within"), (-1.0, "within"), (2.5, "above"), (-2.5, "below"), (2.0, "within")]
)
def test_verdicts_at_the_interval(claimed: float, verdict: str) -> None:
    assert holdout.verdict_of(claimed, -2.0, 2.0).value == verdict


def _table_row(markdown: str, section: str, first: str) -> list[str]:
    """The cells of the row of `section`'s table whose first cell is `first`."""
    body = markdown.split(f"## {section}\n")[1].split("\n## ", maxsplit=1)[0]
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in {section!r}")


def test_the_renderers_print_the_section(sqlite_url: str) -> None:
    write(sqlite_url, fleet())
    found = savings.weekly_summary(sqlite_url, "2026-W47")
    markdown = report_text.render_markdown(found)
    cells = _table_row(markdown, "Held-out check", "gpu-east")
    assert cells[2:5] + cells[6:7] + cells[-1:] == [JOB, "GPU-hours", "2", "3", "net within interval"]
    assert "prediction interval" in markdown.split("## Held-out check")[1].split("## ")[0]
    # Figures large enough to read at two decimals, set by hand into the report the store gave.
    check = dataclasses.replace(
        found.held_out[0],
        plain_step_seconds=0.1234,
        plain_step_sd=0.0056,
        stitched_step_seconds=0.0987,
        charged_seconds=1234.56,
        saving_hours=-12.5,
        low_hours=-30.25,
        high_hours=5.75,
        claimed_hours=8.0,
        charged_hours=0.5,
        verdict="above",
    )
    after = (holdout.CheckedNet("gpu", 17.0, 1, 14.75),)
    report = dataclasses.replace(found, held_out=(check,), after_check=after)
    markdown = report_text.render_markdown(report)
    assert _table_row(markdown, "Held-out check", "gpu-east") == [
        "gpu-east",
        "vision",
        JOB,
        "GPU-hours",
        "2",
        "123.400 ± 5.600",
        "3",
        "98.700",
        "1,234.6",
        "-12.50 (-30.25 to 5.75)",
        "8.00",
        "7.50",
        "net above interval",
    ]
    label = "Net GPU-hours after the held-out check (jobs checked: 1)"
    assert _table_row(markdown, "Fleet totals", label) == [label, "14.75"]
    page = report_html.render_html(report)
    assert "<h2>Held-out check</h2>" in page and f"<td>{JOB}</td>" in page
    assert '<td class="num">-12.50 (-30.25 to 5.75)</td>' in page and "<td>net above interval</td>" in page
    assert f'<td>{label}</td><td class="num">14.75</td>' in page


def test_a_week_without_holdouts_says_so_in_one_line(sqlite_url: str) -> None:
    write(sqlite_url, fleet())
    report = savings.weekly_summary(sqlite_url, "2026-W45")
    markdown = report_text.render_markdown(report)
    section = markdown.split("## Held-out check\n\n")[1].split("\n\n## ")[0]
    assert section == report_text.NO_HELD_OUT
    assert f"<p>{report_text.NO_HELD_OUT}</p>" in report_html.render_html(report)


def cpu_job() -> list[r.Row]:
    """A second checked job in W47: resnet-h on CPU (another job than the GPU one, its hours in core-hours), with
    holdouts H8 (mean step 0.9) and H10 (0.95) and one stitched run S8 (three paired windows, 2 s saved each)."""
    rows: list[r.Row] = []
    for uid, day, plain in (("h8", 19, 0.9), ("h10", 20, 0.95)):
        rows += [started(key(JOB, uid), at(day, 1), kind="cpu"), *holdout_run(key(JOB, uid), day, plain)[1:]]
    return [*rows, started(key(JOB, "s8"), at(19, 1), kind="cpu"), *stitched_run(key(JOB, "s8"), 19, 3)]


def _figures(check: holdout.HeldOutCheck) -> dict[str, object]:
    """What the checks CSV's row must say for `check`: its columns, by name, from the HeldOutCheck."""
    return {
        "cluster": check.cluster,
        "namespace": check.namespace,
        "job_name": check.job_name,
        "device_kind": check.device_kind,
        "unit": savings.UNITS[check.device_kind],
        "holdout_runs": check.holdout_runs,
        "holdout_mean_step_seconds": check.plain_step_seconds,
        "holdout_step_sd_seconds": check.plain_step_sd,
        "stitched_runs": check.stitched_runs,
        "stitched_rank_steps": check.stitched_rank_steps,
        "stitched_mean_step_seconds": check.stitched_step_seconds,
        "charged_rank_seconds": check.charged_seconds,
        "saving_between_runs_hours": check.saving_hours,
        "saving_low_hours": check.low_hours,
        "saving_high_hours": check.high_hours,
        "in_job_claim_hours": check.claimed_hours,
        "charged_hours": check.charged_hours,
        "in_job_net_hours": check.in_job_net_hours,
        "excess_hours": check.excess_hours,
        "verdict": check.verdict,
    }


def _parsed(row: dict[str, str], like: dict[str, object]) -> dict[str, object]:
    """The CSV's text cells as the types of `like`'s values: full precision, so floats compare exactly."""
    return {name: type(value)(row[name]) for name, value in like.items()}


def test_the_checks_csv_has_a_row_per_checked_job(sqlite_url: str) -> None:
    write(sqlite_url, fleet() + cpu_job())
    report = savings.weekly_summary(sqlite_url, "2026-W47")
    assert [(c.job_name, c.device_kind) for c in report.held_out] == [(JOB, "gpu"), (JOB, "cpu")]
    text = report_text.checks_csv(report)
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == ["week", *_figures(report.held_out[0])]  # the columns, named with their units
    found = list(reader)
    assert len(found) == 2 and all(row["week"] == "2026-W47" for row in found)
    for row, check in zip(found, report.held_out, strict=True):
        expected = _figures(check)
        assert _parsed(row, expected) == expected
    # The CPU job by hand: m (0.9 + 0.95) / 2; S8's baseline and three stitched windows, 100 steps each.
    cpu = found[1]
    assert (cpu["unit"], cpu["holdout_runs"], cpu["stitched_rank_steps"]) == ("CPU core-hours", "2", "400")
    assert float(cpu["holdout_mean_step_seconds"]) == pytest.approx(0.925, rel=1e-12)
    # No prose: the header and one line per job, nothing else.
    assert text.count("\n") == 3 and text.startswith("week,cluster,namespace,job_name,device_kind,unit,")


def test_the_checks_csv_of_a_week_without_a_check_is_its_header(sqlite_url: str) -> None:
    write(sqlite_url, fleet())
    report = savings.weekly_summary(sqlite_url, "2026-W45")
    assert report.held_out == ()
    assert report_text.checks_csv(report) == ",".join(report_text.CHECK_HEADER) + "\n"


def test_the_checks_csv_through_the_cli(sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(sqlite_url, fleet() + cpu_job())
    base = ["report", "weekly", "--db", sqlite_url, "--format", "csv", "--csv-table", "checks"]
    assert cli.main([*base, "--week", "2026-W47"]) == 0
    out = capsys.readouterr().out
    checks = savings.weekly_summary(sqlite_url, "2026-W47").held_out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [_parsed(row, _figures(check)) for row, check in zip(rows, checks, strict=True)] == [
        _figures(check) for check in checks
    ]
    assert len(rows) == 2
    target = tmp_path / "checks.csv"
    assert cli.main([*base, "--week", "2026-W45", "-o", str(target)]) == 0
    assert "wrote csv report for 2026-W45 (0 jobs checked)" in capsys.readouterr().out
    assert target.read_text() == ",".join(report_text.CHECK_HEADER) + "\n"


def test_an_unknown_csv_table_is_an_argparse_error(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", "weekly", "--db", sqlite_url, "--format", "csv", "--csv-table", "check"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --csv-table: invalid choice: 'check' (choose from" in err
    # The parser offers every table the command renders (its choices are spelt out, not imported).
    offered = err.split("(choose from ", 1)[1].split(")", 1)[0]
    assert offered == ", ".join(repr(table) for table in report_command.CSV_TABLES)
