"""Text encoders (sentence-transformers, ONNX, static) behind a disk cache, and the FAISS tool index.
"""
