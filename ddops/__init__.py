"""ddops: keep a fleet of GPU hosts patched, synced and benchmarked over SSH."""

__version__ = "0.1.0"
