"""Everything trained: one masked NLL, one standardiser, one early-stopped loop, out-of-fold data, and the
models built on them (the blend head and its report, tracer_plus's candidate model, the fine-tuned encoder).
"""
