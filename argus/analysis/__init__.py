"""Progressive diagnosis: L1 anomalous windows, L2 stragglers, L3 degraded kernels, root cause."""

from argus.analysis.diagnose import DiagnoseConfig, Diagnosis, diagnose
from argus.analysis.incident import ACTIONS, CLASSES, SEVERITIES, STATES, Incident

__all__ = ["ACTIONS", "CLASSES", "DiagnoseConfig", "Diagnosis", "Incident", "SEVERITIES", "STATES", "diagnose"]
