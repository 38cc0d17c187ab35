"""Reports: one self-contained HTML file per run attempt (inline SVG plots, no script, no
external resource), and the gathering and plot code the web UI reuses."""

from argus.report.build import ReportResult, build_report
from argus.report.collect import Gatherer, gather, incidents_of
from argus.report.model import EvidenceFile, IncidentView, JobLogView, KernelCdfs, PhaseHeatmap, ReportData, StepSeries
from argus.report.page import render_report
from argus.report.sources import Fingerprint, evidence_files, fingerprint, stored_incidents

__all__ = ["EvidenceFile", "Fingerprint", "Gatherer", "IncidentView", "JobLogView", "KernelCdfs", "PhaseHeatmap", "ReportData",
           "ReportResult", "StepSeries", "build_report", "evidence_files", "fingerprint", "gather", "incidents_of",
           "render_report", "stored_incidents"]
