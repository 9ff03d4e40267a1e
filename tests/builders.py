"""What tests build from: messages, the tiny hand-written dataset, a keyword embedder with cosines known by
hand, the baselines' hand-made steps and a fake model, a blend-head config, a scorer with a fixed ranking,
and the repository paths. One place; test modules import from here
(``tests/`` is on the path: ``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

from tracer.core.types import Step, Tool, Trajectory
from tracer.scorer_base.fit import FitReport
from tracer.scorer_base.protocol import ScorerBase
from tracer.scorer_base.records import Scores

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def call(name: str, i: int = 0, **args) -> dict:
    """One assistant message holding one tool call."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


def result(i: int = 0, content: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": content}


TINY_TOOLS = (
    Tool("search_flights", "Search flights between two airports on a date"),
    Tool("book_flight", "Book a flight for the user by flight number"),
    Tool("cancel_booking", "Cancel an existing booking by its id"),
    Tool("get_weather", "Get the weather forecast for a city"),
    Tool("send_email", "Send an email message to a recipient"),
    Tool("list_files", "List the files in the current directory"),
)


def fitted_scorer(scorer, trajectories, res):
    """``scorer`` after ``scorer.fit(trajectories, res)`` (``fit`` returns a FitReport, not the scorer)."""
    scorer.fit(trajectories, res)
    return scorer


def call_names(ds) -> list[str]:
    return [s.gold for s in ds.steps()]


def tiny_trajectories() -> list[Trajectory]:
    """A handful of conversations over :data:`TINY_TOOLS` (two turns in some)."""
    convs = [
        ("t0", [{"role": "user", "content": "Find me a flight from SFO to JFK tomorrow and book it"},
                call("search_flights", 0), result(0), call("book_flight", 1), result(1)]),
        ("t1", [{"role": "user", "content": "Search flights to Boston on Friday then book the cheapest"},
                call("search_flights", 0), result(0), call("book_flight", 1), result(1),
                {"role": "user", "content": "Actually cancel that booking"}, call("cancel_booking", 2),
                result(2)]),
        ("t2", [{"role": "user", "content": "What is the weather in Paris? Email it to Bob"},
                call("get_weather", 0), result(0), call("send_email", 1), result(1)]),
        ("t3", [{"role": "user", "content": "Look up flights to Denver"}, call("search_flights", 0),
                result(0), {"role": "user", "content": "Tell me the weather in Denver"},
                call("get_weather", 1), result(1)]),
        ("t4", [{"role": "user", "content": "Show the files here"}, call("list_files", 0), result(0)]),
    ]
    return [Trajectory(id=i, group=i, domain="tiny", messages=tuple(m)) for i, m in convs]


# ---- baselines (issue 5): a keyword embedder with known cosines and resources over TINY_TOOLS
# ----------------
KEYWORDS = ("flight", "book", "cancel", "weather", "email", "file")


class KeywordEmbedder:
    """Maps a text to the normalised indicator of the keywords it contains (substring, case-insensitive).

    A text without any keyword maps to the last ("none") axis, so every row is a unit vector and
    cosines are known by hand: e.g. ``"book_flight: Book a flight"`` -> (flight + book) / sqrt(2).
    """

    def __init__(self, keywords=KEYWORDS):
        self.keywords = tuple(keywords)
        self.name = "keyword:" + ",".join(self.keywords)
        self.dim = len(self.keywords) + 1

    def encode(self, texts):
        out = torch.zeros(len(texts), self.dim)
        for i, text in enumerate(texts):
            low = text.lower()
            hits = [j for j, k in enumerate(self.keywords) if k in low] or [self.dim - 1]
            out[i, hits] = 1.0
        return torch.nn.functional.normalize(out, dim=1)  # [N, dim]


# ---- baselines by hand (test_baselines.py, test_insight.py): a step whose context is one message, a
# one-turn trajectory, registry names, a fake model
def step(history: tuple[str, ...], user: str, position: int = 0) -> Step:
    """A step whose context is one user message (the calls of ``history`` are not in the context)."""
    return Step(trajectory_id="q", group="q", turn=0, position=position,
                prefix=history[len(history) - position:], history=history, gold="",
                context=({"role": "user", "content": user},))


def traj(tid: str, user: str, calls: list[str], success: bool = True,
         results: list[str] | None = None) -> Trajectory:
    msgs: list[dict] = [{"role": "user", "content": user}]
    for i, name in enumerate(calls):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": (results or ["ok"] * len(calls))[i]})
    return Trajectory(id=tid, group=tid, domain="tiny", messages=tuple(msgs), success=success,
                      reward=1.0 if success else 0.0)


def names(registry, ids) -> list[str]:
    return [registry[i].name for i in ids]


class FakeModel:
    """A deterministic executor that writes text, counts its calls and calls every non-weather step
    routine."""

    name = "fake"
    is_oracle = False
    tokenizer_name = None
    lesson = "Do check the weather first; avoid emailing without a recipient."

    def __init__(self):
        self.calls = 0

    def complete(self, messages) -> str:
        self.calls += 1
        prompt = messages[-1]["content"]
        if "routine" in prompt and "weather" not in prompt:
            return "SKIP"
        if "past episodes" in prompt:
            return self.lesson
        return "The user wants the weather."


# ---- the blend head's tests (test_blend.py, test_blend_head.py): a head config that fits in seconds
BLEND_HEAD = {"inner_folds": 5, "t_floor": 0.05, "lr": 0.05, "weight_decay": 1e-3, "max_epochs": 500,
              "patience": 50, "rotate": True, "batch_size": 0}


# ---- evaluation: a scorer with a fixed ranking, the tiny dataset as a native directory
# -------------------------
class FixedRankScorer(ScorerBase):
    """Ranks the registry in order, then moves the gold tool to score ``gold`` (2.0: first; -1e9: last) and,
    if given, the tool ``prefer`` to score 1.0 (second after a first-placed gold)."""

    def __init__(self, gold: float, prefer: str | None = None):
        self.name, self.gold, self.prefer = f"fixed_rank_{gold:g}", gold, prefer

    def fit(self, trajectories, res):
        self.res = res
        return FitReport(self.name, len(trajectories), 0, 0.0)

    def score(self, steps):
        reg = self.res.registry
        primary = -torch.arange(len(reg), dtype=torch.float32).repeat(len(steps), 1)  # [B, N] registry order
        if self.prefer is not None:
            primary[:, reg.id(self.prefer)] = 1.0
        for i, s in enumerate(steps):
            if s.gold in reg:
                primary[i, reg.id(s.gold)] = self.gold
        return Scores(primary=primary, fallback=torch.zeros_like(primary),
                      fell_back=torch.zeros(len(steps), dtype=torch.bool))



def tool_call(name: str, cid: str, **args) -> dict:
    """One entry of an assistant message's ``tool_calls``."""
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


# ---- a cascade with two real trained encoders (scorer=cascade): the retriever and gateway tests
# --------------------
def cascade_retriever(data, enc_dir: Path, static_base: Path):
    """``Retriever.from_dataset(data, "cascade", ...)`` with both encoders trained on ``data`` in ``enc_dir``:
    a static table for the fast stage (from the distillation of ``static_base``, conftest's ``minilm_small``,
    built once in .cache/encoders and linked in) and MiniLM cut to one layer and fine-tuned for the slow one
    (the real slow stage is 6 layers, mnrl_int8.yaml): seconds. Escalates the steps whose fast-stage gate is
    under 0.99 (a table trained on five conversations is sure of most; both stages answer the tests' steps);
    both encoders' configs are saved with the index."""
    from tracer.encode.static import distilled
    from tracer.retriever import Retriever

    start = distilled(static_base).resolve()
    enc_dir.mkdir(parents=True, exist_ok=True)
    (enc_dir / start.name).symlink_to(start)
    common = {"context": {"join_users": True}, "successful_only": True, "base_model": None, "device": "cpu",
              "encoder_dir": str(enc_dir), "batch_size": 6, "warmup": 0.1, "weight_decay": 0.0, "epochs": 1,
              "scale": 20.0, "seed": 0}
    recipe = {**common, "kind": "static", "lr": 1e-2, "max_seq_length": 512, "base_model": str(static_base),
              "slow": {**common, "lr": 1e-4, "max_seq_length": 48, "layers": [5]}}
    # the stages serve their models (the guard would serve the zero-shot ranking on 5 trajectories)
    head = {"head": {"max_epochs": 10, "inner_folds": 2}, "zero_shot": {"kind": "vector", "guard": False}}
    return Retriever.from_dataset(data, "cascade", device="cpu", cache_dir=None, encoder_training=recipe,
                                  fast=head, slow=head, escalate=0.99)


# ---- a tiny BERT for the encoder-artifact tests: MiniLM's tokenizer, 4,000 word pieces, one 32-wide layer
# ----------
def _cut_tokenizer(out: Path, vocab: int) -> Path:
    """MiniLM's tokenizer and sentence-transformers files copied to ``out``, the word pieces cut to the first
    ``vocab``; returns MiniLM's own folder."""
    import shutil

    from tracer.encode.embedders import minilm_path

    src = minilm_path()
    out.mkdir(parents=True)
    doc = json.loads((src / "tokenizer.json").read_text())
    doc["model"]["vocab"] = {t: i for t, i in doc["model"]["vocab"].items() if i < vocab}
    (out / "tokenizer.json").write_text(json.dumps(doc))
    (out / "vocab.txt").write_text("".join(t + "\n" for t in sorted(doc["model"]["vocab"],
                                                                    key=doc["model"]["vocab"].get)))
    for name in ("tokenizer_config.json", "special_tokens_map.json", "modules.json",
                 "sentence_bert_config.json"):
        shutil.copy(src / name, out / name)
    shutil.copytree(src / "1_Pooling", out / "1_Pooling")
    return src


def tiny_bert(out: Path, vocab: int = 4000) -> Path:
    """A sentence-transformers folder at ``out``: MiniLM's own tokenizer cut to its first ``vocab`` word
    pieces and a seeded random one-layer BERT of width 32 over them. It exports to ONNX in ~2 s and distils
    with model2vec in ~1 s (MiniLM: minutes), so the tests of what is cached from a model (exports, tables,
    checkpoints) can rebuild."""
    from transformers import BertConfig, BertModel

    _cut_tokenizer(out, vocab)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text()) | {"word_embedding_dimension": 32}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(str(out))
    return out


def minilm_cut(out: Path, vocab: int = 6000) -> Path:
    """MiniLM itself, its weights and tokenizer, with the word pieces cut to the first ``vocab`` (the
    special tokens, characters and the most frequent words): a real encoder whose model2vec distillation is
    a few CPU-seconds, where MiniLM's 30,522 pieces take over a CPU-minute. For the tests of what is built
    on a distillation (a static table trained, carried and served), not of the distillation itself."""
    from transformers import BertModel

    src = _cut_tokenizer(out, vocab)
    net = BertModel.from_pretrained(str(src))
    net.resize_token_embeddings(vocab)  # the first ``vocab`` rows, MiniLM's own
    net.save_pretrained(str(out))
    return out


def git(*args: str, cwd: Path) -> None:
    """Run git in ``cwd``; a failure raises."""
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def git_repo(root: Path, files: dict[str, str]) -> Path:
    """A real git repository at ``root`` holding ``files`` in one commit."""
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git("init", "-q", cwd=root)
    git("add", ".", cwd=root)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x", cwd=root)
    return root


def jsonl(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# a Seal-Tools clone in miniature: its tool file and one split
SEAL_TOOLS_FILES = {
    "Seal-Tools_Dataset/tool.jsonl": jsonl(
        {"api_name": "getWaterQuality", "api_description": "Get  the water quality\nof a lake",
         "parameters": {"lake": {"type": "str", "description": "Name of\nthe lake"}}},
        {"api_name": "getCustomsInfo", "api_description": "Customs information of a shipment"}),
    "Seal-Tools_Dataset/dev.jsonl": jsonl(
        {"id": "dev-0", "query": "Tell me the water quality of the lake.",
         "calling": [{"api": "getWaterQuality", "parameters": {}}]},
        {"id": "dev-1", "query": "Customs of QKE and the lake's water",
         "calling": [{"api": "getCustomsInfo"}, {"api": "getWaterQuality"}, {"api": "getCustomsInfo"},
                     {"api": "notATool"}]},
        {"id": "dev-2", "query": "only unknown tools", "calling": [{"api": "notATool"}]}),
}
