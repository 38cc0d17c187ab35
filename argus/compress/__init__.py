"""Kernel-event compression: name normalisation, KDE mode summaries, log-bucket sketches,
distribution reconstruction and Wasserstein distances."""

from argus.compress.distance import empirical_cdf, log_grid, mixture_cdf, sketch_cdf, w1, w1_matrix, w1_to_reference
from argus.compress.kde import KdeConfig
from argus.compress.refine import REFINED_W1_BOUND, RefineConfig
from argus.compress.names import COMM_OPS, categorize_kernel, normalize_kernel_name
from argus.compress.sketch import DEFAULT_SCHEMA, LogSketch, relative_error
from argus.compress.summarize import (Cluster, CompressConfig, sketch_from_row, summarize_durations,
                                      summarize_kernel_arrays, summarize_kernels)

__all__ = ["empirical_cdf", "log_grid", "mixture_cdf", "sketch_cdf", "w1", "w1_matrix", "w1_to_reference", "COMM_OPS", "Cluster", "CompressConfig", "DEFAULT_SCHEMA", "KdeConfig", "LogSketch", "REFINED_W1_BOUND", "RefineConfig", "categorize_kernel",
           "normalize_kernel_name", "relative_error", "sketch_from_row", "summarize_durations", "summarize_kernel_arrays",
           "summarize_kernels"]
