"""valetkey benchmarks: run from the repository root with the project venv (see docs/benchmarks.md)."""
