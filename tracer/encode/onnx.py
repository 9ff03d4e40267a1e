"""ONNX Runtime encoders: the sentence-transformers model exported once, in fp32 or dynamic int8.

The export is the transformer alone (``torch.onnx.export`` of the Hugging Face model); tokenisation
(the folder's own tokenizer, truncated at the model's ``max_seq_length``), mean pooling over the
attention mask and L2 normalisation are done here, as sentence-transformers does them, so fp32 gives
the torch embeddings to float rounding. The model is exported with eager attention
so that ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``, model type ``bert``)
can fuse each layer's attention, the embedding layer norm and the bias-GELU into its own kernels; ``fp32``
is that fused graph. The residual adds and their layer norms are left as ``Add`` + ``LayerNormalization``
(the optimizer's skip-layer-norm fusions off, and ONNX Runtime's own ``SkipLayerNormFusion`` disabled in the
session): ONNX Runtime 1.32's CPU ``SkipLayerNormalization`` kernel took 452 us of the 1,488 us of kernel time
in a single-text int8 encode of the 3-layer student (6 nodes, 48 word pieces), the two plain ops 86 us, so
the unfused pair makes that encode 1.000 ms instead of 1.455 ms (fp32: 3.049 against 3.404 ms;
``experiments/studies/onnx_export/profile_onnx.py``) with the same embeddings to float rounding
(experiments/studies/onnx_export/README.md, "The skip layer norm left unfused"). ``int8`` is
``onnxruntime.quantization.quantize_dynamic`` of it with per-channel int8 weights on the MatMul and fused
Attention nodes (activations quantised on the fly).

    python -m tracer.encode.onnx            # export MiniLM to .cache/encoders (fp32 + int8)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.fusion_options import FusionOptions
from onnxruntime.transformers.optimizer import optimize_model
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from tracer.core.tool_text import check_tool_text
from tracer.encode.bundle import Served
from tracer.encode.embedders import recorded_tool_text
from tracer.encode.manifest import fingerprint, new_artifact, reuse, verify
from tracer.encode.source import DEFAULT_CACHE, recipe_hash, short_name, source_hash

VARIANTS = ("fp32", "int8")
OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# ONNX Runtime fusions left undone, offline and in the session: its CPU SkipLayerNormalization is slower than
# the Add + LayerNormalization it replaces (module docstring)
UNFUSED = ("SkipLayerNormFusion",)


def session(path: str | Path, threads: int = 1, profile_prefix: str | None = None,
            save_optimized: str | Path | None = None) -> ort.InferenceSession:
    """An ONNX Runtime CPU session on an exported graph: ``threads`` intra-op threads, one inter-op, the
    ``UNFUSED`` fusions left out; ``profile_prefix``: ONNX Runtime's profiler on, its file named so;
    ``save_optimized``: where to write the graph as the session runs it (after its own fusions)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if save_optimized:
        opts.optimized_model_filepath = str(save_optimized)
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(UNFUSED))


def feeds(encodings: Sequence) -> dict[str, np.ndarray]:
    """The graph's inputs from ``tokenizers`` encodings of one padded batch, ``[B, T]`` int64 each."""
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


class _Transformer(torch.nn.Module):
    """The Hugging Face model with named inputs and one output, as the exporter wants it."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.net(input_ids=input_ids, attention_mask=attention_mask,
                        token_type_ids=token_type_ids).last_hidden_state  # [B, T, d]


def max_seq_length(folder: Path) -> int:
    """The folder's sentence-transformers truncation length (256 for MiniLM). Older sentence-transformers
    write it to sentence_bert_config.json; newer ones (our fine-tuned checkpoints) to the tokenizer's
    ``model_max_length``, which is where they read it back from."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):
        cfg = folder / name
        if cfg.is_file() and key in (doc := json.loads(cfg.read_text())):
            return int(doc[key])
    return 512


def export(model: str | Path | None = None, encoder_dir: str | Path = DEFAULT_CACHE,
           skip_layer_norm: bool = False) -> Path:
    """Export ``model`` to ``<encoder_dir>/onnx-<hash>/`` (``fp32.onnx``, ``int8.onnx``, tokenizer); reused
    when it matches its manifest, exported again when it does not (:mod:`tracer.encode.manifest`).

    ``skip_layer_norm=True`` fuses the residual adds into SkipLayerNormalization as the optimizer does by
    default: the slower graph (module docstring), kept for experiments/studies/onnx_export/profile_onnx.py to
    compare with."""
    return exported(model, encoder_dir, skip_layer_norm)[0]


def exported(model: str | Path | None = None, encoder_dir: str | Path = DEFAULT_CACHE,
             skip_layer_norm: bool = False) -> tuple[Path, str]:
    """:func:`export`'s folder and its manifest digest (the export's content fingerprint), its files hashed
    once."""
    folder, weights = source_hash(model)
    # how the model reads tools goes with its export (train_info.json is no part of the weights' hash)
    # (only where it is not the default: exports of name-and-description models keep their keys and files)
    style = recorded_tool_text(folder)
    reads = {"tool_text": style} if style != "name_description" else {}
    key = recipe_hash(kind="onnx", weights=weights, opset=OPSET,
                      graph="bert-fused" if skip_layer_norm else "bert-fused-no-skip-layernorm",
                      quant="dynamic-matmul-attention-perchannel-qint8", **reads)
    out = Path(encoder_dir) / f"onnx-{key[:16]}"
    if (digest := reuse(out)) is not None:
        return out, digest
    with new_artifact(out, {"kind": "onnx", "key": key}) as tmp:
        # eager attention: the exported graph then has the pattern the optimizer fuses (SDPA's has not)
        net = AutoModel.from_pretrained(str(folder), attn_implementation="eager",
                                        local_files_only=True).eval()
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        sample = tok(["an example text", "a second, longer example text"], padding=True, return_tensors="pt")
        args = tuple(sample[k] for k in _INPUTS)
        dyn = {k: {0: "batch", 1: "seq"} for k in _INPUTS} | {"last_hidden_state": {0: "batch", 1: "seq"}}
        with torch.no_grad():
            torch.onnx.export(_Transformer(net), args, str(tmp / "exported.onnx"), input_names=list(_INPUTS),
                              output_names=["last_hidden_state"], dynamic_axes=dyn, opset_version=OPSET,
                              dynamo=False)
        cfg, fusions = net.config, FusionOptions("bert")
        fusions.enable_skip_layer_norm = fusions.enable_bias_skip_layer_norm = skip_layer_norm
        optimize_model(str(tmp / "exported.onnx"), model_type="bert", num_heads=cfg.num_attention_heads,
                       hidden_size=cfg.hidden_size,
                       optimization_options=fusions).save_model_to_file(str(tmp / "fp32.onnx"))
        (tmp / "exported.onnx").unlink()
        quantize_dynamic(str(tmp / "fp32.onnx"), str(tmp / "int8.onnx"), per_channel=True,
                         op_types_to_quantize=["MatMul", "Attention"], weight_type=QuantType.QInt8,
                         # fused ops lack shape info
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        tok.save_pretrained(str(tmp / "tokenizer"))
        (tmp / "source.json").write_text(json.dumps({"model": str(folder),
                                                      "max_seq_length": max_seq_length(folder),
                                                      "name": short_name(model), "key": key} | reads))
    return out, verify(out)


class OnnxEmbedder:
    """A sentence-transformers model run by ONNX Runtime (CPU).

    Args:
        model: local model folder (``None``: the bundled MiniLM), exported on first use; or a folder that is
            an export already (its ``source.json`` and ``<variant>.onnx``: the encoder a saved index
            carries), loaded as it is (verified against its manifest, a damaged file named).
        variant: ``fp32`` or ``int8``.
        encoder_dir: where exports live.
        threads: ONNX Runtime intra-op threads (1: the single-thread serving figure; 0: ORT's default).
        batch_size: texts per session run. 1, the default, encodes every text alone, as a live step does.
            Dynamic int8 quantises a run's activations with one scale over the whole padded batch, so an int8
            vector depends on the texts run with it (BFCL contexts in batches of 64: mean cosine 0.991-0.995
            to the same text alone, ``experiments/studies/onnx_export/onnx_batching.py``), which an
            evaluation must not score and a cache keyed by the text must not store; one text at a time is
            also the faster on one thread (no padding). An int8 embedder's name carries its batch size (fp32
            gives the same vectors either way).
        tool_text: how tools read to the model (:mod:`tracer.core.tool_text`); ``None``: as the exported
            model was trained (its export's ``source.json``).
    """

    def __init__(self, model: str | Path | None = None, variant: str = "int8",
                 encoder_dir: str | Path = DEFAULT_CACHE, threads: int = 1, batch_size: int = 1,
                 tool_text: str | None = None):
        if variant not in VARIANTS:
            raise ValueError(f"OnnxEmbedder variant must be one of {VARIANTS}, got {variant!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"OnnxEmbedder batch_size must be an integer >= 1, got {batch_size!r}")
        # the export's manifest digest: what the embedding cache keys these vectors by, beside the name
        ready = (model is not None and (Path(model) / "source.json").is_file()
                 and (Path(model) / f"{variant}.onnx").is_file())
        self.dir, self.fingerprint = ((Path(model), fingerprint(model)) if ready
                                      else exported(model, encoder_dir))
        self.variant = variant
        meta = json.loads((self.dir / "source.json").read_text())
        # int8 vectors of one text differ with the batch it ran in: the batch size is part of what made them
        self.name = (f"{meta['name']}-onnx-{variant}-{meta['key'][:16]}"
                     + (f"-batch{batch_size}" if variant == "int8" else ""))
        self.max_seq_length = int(meta["max_seq_length"])
        self.tool_text = check_tool_text(meta.get("tool_text", "name_description") if tool_text is None
                                         else tool_text, "OnnxEmbedder tool_text")
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.dir / "tokenizer"), local_files_only=True)
        # the Rust tokenizer under it, truncating and padding as the Hugging Face call does (truncation=True,
        # max_length, padding=True), without that call's per-text Python, which the fast preset's step notices
        self.fast_tokenizer = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        self.fast_tokenizer.enable_truncation(self.max_seq_length)
        self.fast_tokenizer.enable_padding(pad_id=self.tokenizer.pad_token_id,
                                           pad_token=self.tokenizer.pad_token)
        self.session = session(self.dir / f"{variant}.onnx", threads)
        self.dim = int(self.session.get_outputs()[0].shape[-1])
        self.batch_size = batch_size

    def served(self) -> Served:
        """The files this embedder runs on (the variant's graph, the tokenizer, ``source.json``; not the other
        variant's graph), for a saved index to carry."""
        files = [f"{self.variant}.onnx", "source.json",
                 *(p.relative_to(self.dir).as_posix()
                   for p in sorted((self.dir / "tokenizer").rglob("*")) if p.is_file())]
        return Served(self.dir, tuple(files), {})

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        if not texts:
            return torch.zeros(0, self.dim)
        return torch.from_numpy(np.concatenate([self._encode(list(texts[i: i + self.batch_size]))
                                                for i in range(0, len(texts), self.batch_size)]))  # [N, d]

    def _encode(self, texts: list[str]) -> np.ndarray:
        inputs = feeds(self.fast_tokenizer.encode_batch(texts))           # [B, T] each
        hidden = self.session.run(None, inputs)[0]                         # [B, T, d]
        mask = inputs["attention_mask"][..., None].astype(np.float32)      # [B, T, 1]
        pooled = (hidden * mask).sum(1) / np.clip(mask.sum(1), 1e-9, None)  # [B, d] mean over real tokens
        return (pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True),
                                 1e-12, None)).astype(np.float32)


if __name__ == "__main__":
    print(export())
