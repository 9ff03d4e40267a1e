"""The repository, the example dataset the soak's index is fitted on and whose tools the agents ask for,
and the unit its report counts bytes in."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "example"
MiB = 1024 * 1024
