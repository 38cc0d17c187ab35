"""``argus healthcheck``: know what healthy looks like — measured, archived, compared.

Levels (``model.Level``): the device's arithmetic and memory, host↔device links, collectives
between ranks, the bundled model's throughput; each run is judged against the node's own
baseline and against its peers (``baseline.judge``). See ``docs/healthcheck.md``.
"""

from argus.healthcheck.baseline import DEFAULT_THRESHOLD, default_dir, judge, load_baseline, save_baseline
from argus.healthcheck.model import SCHEMA_VERSION, HealthReport, Level, LocalGpu, Measurement, Status, Verdict
from argus.healthcheck.run import AGAIN_PAUSES_S, CheckConfig, measure_again, run_checks

__all__ = ["AGAIN_PAUSES_S", "CheckConfig", "DEFAULT_THRESHOLD", "HealthReport", "Level", "LocalGpu", "Measurement", "SCHEMA_VERSION",
           "Status", "Verdict", "default_dir", "judge", "load_baseline", "measure_again", "run_checks", "save_baseline"]
