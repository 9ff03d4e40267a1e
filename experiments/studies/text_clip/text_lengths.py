"""Does the character clip before tokenizing (tracer.encode.embedders.clip_texts) change any embedding on our
datasets?

    python -m experiments.studies.text_clip.text_lengths            # bfcl (executed), tau2, apibank

For every decision step it renders the longest text any scorer can embed (the whole conversation,
system prompt, calls with arguments, full tool results) plus every tool's search text, and reports the
longest text in characters and word pieces. A text longer than the clip keeps its embedding exactly when
its clipped prefix still holds at least ``max_seq_length`` word pieces (the encoder cuts there anyway);
the script counts the texts for which that fails (it must print 0).
"""

from __future__ import annotations

import sys

from tracer.core.context import ContextRendering
from tracer.data import load_dataset
from tracer.encode.embedders import CHARS_PER_PIECE, SentenceTransformerEmbedder

LONGEST = ContextRendering(window="all", calls="names_args", results="full", system=True)


def main(names=("bfcl", "tau2", "apibank")) -> int:
    enc = SentenceTransformerEmbedder(device="cpu", progress=0)
    tok, max_pieces = enc.model.tokenizer, enc.max_seq_length
    limit = max_pieces * CHARS_PER_PIECE
    changed = 0
    print(f"clip: {max_pieces} word pieces x {CHARS_PER_PIECE} = {limit:,} characters\n")
    print("| dataset | texts | longest (chars) | longest (word pieces) | chars per piece (all texts) | over "
          "the clip | embedding changed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        ds = load_dataset(name)
        texts = [LONGEST.render(s.context) for s in ds.steps()] + [t.search_text for t in ds.registry]
        texts = sorted(set(texts), key=len)
        longest = texts[-1]
        pieces = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        ratio = sum(map(len, texts)) / max(sum(pieces), 1)
        over = [t for t in texts if len(t) > limit]
        bad = sum(len(tok(t[:limit], add_special_tokens=False)["input_ids"]) < max_pieces for t in over)
        changed += bad
        print(f"| {name} | {len(texts):,} | {len(longest):,} | {max(pieces):,} | {ratio:.2f} | {len(over)} | "
              f"{bad} |")
    return changed


if __name__ == "__main__":
    sys.exit(1 if main(tuple(sys.argv[1:]) or ("bfcl", "tau2", "apibank")) else 0)
