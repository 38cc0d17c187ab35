"""End-to-end tests: real processes on real (namespaced) networks; see docs/testing-network.md."""
