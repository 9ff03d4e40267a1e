"""Benchmarks of the library's speed and cost (benchmarks/README.md); run from the repository root,
``python -m benchmarks.<name>``. tracer never imports this package."""
