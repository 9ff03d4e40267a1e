"""Research beside the library, not part of it (experiments/README.md); run from the repository root,
``python -m experiments.<path>``. tracer never imports this package."""
