"""The shim's ``light_states`` on the real engine (issue 58): llama_cpp's ``Llama.save_state`` with SmolLM2,
in the engine's own Python, keeps one row of logits, and a state saved and loaded again gives the same
next-token logits as the context it was saved from. Skipped, with the command, when the engine or the
weights are not cached."""

from __future__ import annotations

import json
import subprocess

import pytest

from tracer.models import engine_python, get_model, models_dir
from tracer.models.server import SHIM
from tracer.models.weights import is_verified

pytestmark = pytest.mark.slow
SPEC = get_model("smollm2")

SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import llama_cpp
from llama_shim import light_states
full = llama_cpp.Llama(model_path=sys.argv[2], n_ctx=256, verbose=False, logits_all=False)
tokens = full.tokenize(b"The capital of France is")
full.eval(tokens)
heavy = full.save_state()                      # llama_cpp's own: a row of logits per token
light_states(llama_cpp.Llama)
light = full.save_state()
expected = np.array(full.scores[len(tokens) - 1])
full.reset()
full.eval(full.tokenize(b"Something else entirely, to overwrite the context"))
full.load_state(light)
full.eval(tokens[-1:])                         # what generate does after a load: the last token again
print(json.dumps({"tokens": len(tokens), "heavy": list(heavy.scores.shape), "light": list(light.scores.shape),
                  "same_logits": bool(np.allclose(full.scores[full.n_tokens - 1], expected, atol=1e-4))}))
"""


def test_a_saved_state_keeps_one_row_and_restores_the_same_logits():
    python = engine_python()
    if python is None or not is_verified(SPEC.weights_path(), SPEC):
        pytest.skip(f"no llama.cpp engine or verified smollm2 weights under {models_dir()}: "
                    "python -m tracer.models build; python -m tracer.models fetch --model smollm2")
    out = subprocess.run([str(python), "-c", SCRIPT, str(SHIM.parent), str(SPEC.weights_path())],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # llama_cpp's own state holds n_tokens x n_vocab floats; the light one the last row
    assert result["heavy"][0] == result["tokens"] > 1 and result["light"] == [1, result["heavy"][1]]
    assert result["same_logits"]
