"""The demo's balance against plain TF measured in the same run: the plugin's job and the same job without it.

Input: the two jobs' timings, alternated chunk by chunk (`command.Job`: per step its seconds and what it ran, per
chunk its wall, session creation and close). Output: the balance's lines: wall against wall with the noise of the
difference, and where it went per phase of the plugin's steps against plain TF's steps of the same numbers.
"""

from __future__ import annotations

import statistics
from typing import Protocol

from stitchfleet.plugin.control.probe_decisions import NOISE_FACTOR
from stitchfleet.plugin.control.schedule import PROBE, STITCHED

COMPARED = (STITCHED, PROBE, "check")  # the phases whose steps the report's paired windows hold


class Timed(Protocol):
    """What the balance reads of a job (`command.Job`)."""

    times: list[float]  # every step's seconds
    phases: list[str]  # what each step ran, beside its time
    chunks: list[float]  # each chunk's wall seconds (the first includes creating the session)
    created: float  # creating the session: the plugin's setup happens here
    closed: float  # closing it: the hook's end


def against_plain(stitched: Timed, plain: Timed, skipped: str | None = None) -> str:
    """The plugin's job against plain TF's in this run: wall seconds (session creation, where setup happens, and
    its close included), and the noise of the difference from the chunks' paired differences (all but the first,
    which holds the sessions' creation: the setup's cost is the balance's to show, not its noise). When the plugin
    skipped its setup (`skipped`: why), it says so: the balance is then the hooked session's own cost, ~0 within
    the noise."""
    with_plugin, without = sum(stitched.chunks) + stitched.closed, sum(plain.chunks) + plain.closed
    pairs = [a - b for a, b in zip(stitched.chunks, plain.chunks, strict=True)]
    # The first pair holds both sessions' creation (the plugin's setup): a cost, not noise; its spread would hide it
    steady = pairs[1:]
    noise = statistics.stdev(steady) * len(pairs) ** 0.5 if len(steady) > 1 else float("nan")
    saved = without - with_plugin
    beyond = abs(saved) > NOISE_FACTOR * noise
    verdict = ("faster than" if saved > 0 else "slower than") if beyond else "within the noise of"
    return (
        f"\nbalance against plain TF measured in this run (the same job without the plugin, alternated chunk by"
        f" chunk): plugin {with_plugin:.2f} s (of which session creation and setup {stitched.created:.2f} s),"
        f" plain TF {without:.2f} s: {saved:+.2f} s saved (noise {noise:.2f} s); the plugin's job was {verdict}"
        f" plain TF's"
    ) + (_stayed_out(skipped, beyond and saved < 0) if skipped is not None else "")


def where_it_went(stitched: Timed, plain: Timed, first: float = 0.0, every: int = 0) -> str:
    """The balance by what the plugin's steps ran: per phase, the plugin's step seconds against plain TF's steps of
    the same numbers (alternated chunk by chunk, so a phase's pairs are not simultaneous: its noise is the spread
    of those differences times the root of their count), then session creation and close. The phases sum, with
    the time between steps, to the balance; each names where seconds were won or paid. `first`: what the kernels'
    first runs took beyond a usual step, which the report books as setup, not in its windows. `every`: the chunks'
    steps; each phase, and the steps the report books, then also get the noise between chunks (a load that changes
    from one chunk to the next moves all of a chunk's steps one way: the spread of single steps understates it)."""
    lines = ["\nwhere the balance went (the plugin's steps against plain TF's steps of the same numbers; + saved):"]
    created, closed = plain.created - stitched.created, plain.closed - stitched.closed
    lines.append(f"  {'session creation (setup)':<26} {created:+8.2f} s")
    by_phase: dict[str, list[float]] = {}
    for phase, ours, theirs in zip(stitched.phases, stitched.times, plain.times, strict=False):
        by_phase.setdefault(phase, []).append(theirs - ours)
    for phase, saved in sorted(by_phase.items(), key=lambda item: -len(item[1])):
        noise = statistics.stdev(saved) * len(saved) ** 0.5 if len(saved) > 1 else float("nan")
        per_step = statistics.fmean(saved) * 1e3
        chunks = _chunk_noise(stitched, plain, every, {phase})
        between = f", {chunks:.2f} s between chunks" if chunks is not None else ""
        lines.append(
            f"  {phase + ' steps':<26} {sum(saved):+8.2f} s  (noise {noise:.2f} s{between}; {len(saved)} steps,"
            f" {per_step:+.3f} ms a step)"
        )
    # the steps the report's windows book a saving on, as the report's balance line gives it per rank (`balance`)
    compared = [saved for phase in COMPARED for saved in by_phase.get(phase, [])]
    if compared:
        noise = statistics.stdev(compared) * len(compared) ** 0.5 if len(compared) > 1 else float("nan")
        chunks = _chunk_noise(stitched, plain, every, set(COMPARED))
        between = f", {chunks:.2f} s between chunks" if chunks is not None else ""
        lines.append(
            f"  {'of which the report books':<26} {sum(compared):+8.2f} s  (noise {noise:.2f} s per step{between}; the"
            f" stitched, probe and check steps: its measured gross per device less the kernels' first runs,"
            f" {first:.2f} s it books as setup, is the same seconds)"
        )
    close = "close (the hook's end)"
    lines.append(f"  {close:<26} {closed:+8.2f} s")
    return "\n".join(lines)


def _chunk_noise(stitched: Timed, plain: Timed, every: int, phases: set[str]) -> float | None:
    """The standard error of the saving on `phases`' steps from the chunks' sums of it (all but the first, which holds
    the setup's first runs, as `against_plain`'s), times the root of their count; None under three chunks. Why beside
    the steps' spread: on the MLP's 7,753 steps run as written, 0.03 s per step against 0.2 s between chunks (a
    load that changes from one chunk to the next moves all of a chunk's steps one way; session 49)."""
    if every <= 0:
        return None
    sums: dict[int, float] = {}
    for step, (phase, ours, theirs) in enumerate(zip(stitched.phases, stitched.times, plain.times, strict=False)):
        if phase in phases:
            sums[step // every] = sums.get(step // every, 0.0) + theirs - ours
    steady = [saved for chunk, saved in sums.items() if chunk > 0]
    return statistics.stdev(steady) * len(sums) ** 0.5 if len(steady) > 2 else None


def _stayed_out(why: str, harmed: bool) -> str:
    """What the balance means when the plugin skipped its setup: nothing stitched, so ~0 is the expected figure."""
    text = f"\nthe plugin stayed out of the way ({why}): nothing was stitched, so the balance is the hooked session's"
    text += " own cost and the machine's noise, expected ~0"
    return text + (": it is beyond the noise here, which is a cost of the hook" if harmed else ", and it is")
