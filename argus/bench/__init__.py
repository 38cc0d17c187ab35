"""Benchmarks behind ``argus bench``; each returns plain dicts that the CLI prints as JSON."""
