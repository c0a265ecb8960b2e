"""How long the rest of a run takes at the speed measured so far: said once, early, when it is more than a day.

A user who starts the paper's base or big recipe on a CPU learns in the first minutes that it would take
weeks, instead of finding out from a progress bar hours later.
"""

from __future__ import annotations

TIMED_UPDATES = 5  # updates timed after the first (which pays for warm-up) before the forecast
LONG_S = 24 * 3600
CPU_CONFIGS = "quickstart, small or multi30k-de-en (tfm configs lists them)"


def duration(seconds: float) -> str:
    """Seconds as the largest unit that reads well: '3.2 days', '7.5 hours', '12 minutes'."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 60:.0f} minutes"


def forecast(seconds_per_update: float, remaining_updates: int, device_type: str) -> str | None:
    """The message for a run whose remaining updates would take more than a day, else None."""
    total = seconds_per_update * remaining_updates
    if total < LONG_S:
        return None
    message = (
        f"at {seconds_per_update:.2f} s per update, the {remaining_updates:,} updates left to train.max_steps "
        f"would take about {duration(total)} on this machine"
    )
    if device_type == "cpu":
        message += f"; on a CPU use a CPU-sized config: {CPU_CONFIGS}"
    return message
