"""Real training workloads (no Argus inside) used by the demo and the end-to-end tests."""
