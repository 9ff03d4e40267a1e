"""``tracer_plus``, the default scorer, in one package: the scorer (:mod:`.scorer`), its candidates and
features (:mod:`.features`), the candidate model (:mod:`.model`), the scorer's fit (:mod:`.fit`) on the inner
folds' candidates (:mod:`.inner_folds`), the tables precomputed from the tries (:mod:`.index`), one live step
(:mod:`.step`), the request's evidence
(:mod:`.request`, :mod:`.clauses`), the zero-shot ranking (:mod:`.zero_shot`, :mod:`.usage`, :mod:`.dataflow`)
and the guard that picks between it and the model (:mod:`.guard`), serving from a gateway's own logs
(:mod:`.own_logs`) and the index on disk (:mod:`.persist`). docs/method.md describes the method; a saved
index names the class ``tracer.scorers.tracer_plus.TracerPlusScorer``."""

from tracer.scorers.tracer_plus.persist import CLASS_PATH, FORMAT_VERSION
from tracer.scorers.tracer_plus.scorer import TracerPlusScorer

__all__ = ["CLASS_PATH", "FORMAT_VERSION", "TracerPlusScorer"]
