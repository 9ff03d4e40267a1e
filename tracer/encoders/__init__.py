"""Encoders beyond the torch MiniLM: fine-tuning (:mod:`.finetune`), ONNX Runtime fp32/int8 (:mod:`.onnx`)
and static model2vec (:mod:`.static`); the last two need the ``fast`` extra and are imported from their modules.

Each embedder has ``name`` (model + variant + a hash of the weights: its own embedding-cache key),
``dim`` and ``encode(texts) -> Tensor[N, dim]`` (normalised float32), and is built from
``configs/embedder/*.yaml``. Derived models are built offline from a local folder into ``.cache/encoders``.
"""

from .finetune import Pairs, TrainConfig, finetuned, train, training_pairs

__all__ = ["Pairs", "TrainConfig", "finetuned", "train", "training_pairs"]
