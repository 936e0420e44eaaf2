"""What planning reads from a profile directory: its table statistics, batch size and calibration.

One reader for every command that plans or prices from a profile (`optimize --profile`, `plan
check`), so that they refuse the same directories with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.optimizer.coefficients import load_calibration
from sparselift.optimizer.table_stats import TableStats, stats_from_profile


@dataclass
class ProfileInput:
    """A profile directory as planning reads it.

    Attributes:
        stats: the tables as profiled (`stats_from_profile`), in the profile's order.
        batch_size: samples per rank.
        calibration: calibration.json's object, or None where the profile has none.
    """

    stats: list[TableStats]
    batch_size: int
    calibration: dict[str, Any] | None


def read_profile(profile_dir: str | Path, *, need_calibration: bool) -> ProfileInput:
    """Read a profile directory's statistics and, if it has one, its calibration.

    Args:
        profile_dir: the directory (`sparselift profile`'s output, analyzed or not).
        need_calibration: refuse a directory without calibration.json (`optimize`: it plans with
            measured coefficients only).
    Returns:
        The statistics, batch size and calibration.
    Raises:
        UserError: not a directory; no calibration.json where needed; a bad calibration.json or
            access_stats.parquet (the message names the file).
    """
    cal = Path(profile_dir, "calibration.json")
    if not Path(profile_dir).is_dir():
        raise UserError(f"{profile_dir}: not a profile directory")
    if need_calibration and not cal.is_file():
        raise UserError(
            f"{profile_dir} has no calibration.json: run `sparselift analyze {profile_dir}` first"
        )
    calibration = load_calibration(cal) if cal.is_file() else None
    stats, batch = stats_from_profile(profile_dir)
    return ProfileInput(stats, batch, calibration)
