"""``argus drill``: inject a real fault into a job launched here and time what Argus did about it."""

from argus.drill.kinds import EXPECT, DrillKind, Expectation
from argus.drill.runner import Drill, DrillResult, Stage, bundled_job, bundled_link_job, run_drill

__all__ = ["EXPECT", "DrillKind", "Expectation", "Drill", "DrillResult", "Stage", "bundled_job", "bundled_link_job", "run_drill"]
