"""Greedy continuations of the embedded tiny model by its own implementation (glassllm 0.1.0,
NumPy, float32): the independent reference the example's tests compare polyattn's model with.

    pip install glassllm==0.1.0 numpy
    python3 examples/generate/testdata/glass_reference.py > examples/generate/testdata/glass_reference.json
"""
import json
from importlib import resources

from glassllm.model import GlassLM
from glassllm.tokenizer import Tokenizer

PROMPTS = ["Once upon a time", "The little dog", "She said, “", "Alice was beginning to get very tired"]
N = 32

weights = resources.files("glassllm") / "weights"
model = GlassLM.load(weights / "en.npz")
tok = Tokenizer.load(weights / "en.tokenizer.json")
cases = []
for prompt in PROMPTS:
    ids = tok.encode(prompt)
    steps = list(model.generate(ids, N, greedy=True))
    out = [step.token for step in steps]
    # Smallest gap between the two most likely tokens: how far a backend's rounding may go
    # before a greedy choice flips.
    margin = min(float(sorted(s.probs)[-1] - sorted(s.probs)[-2]) for s in steps)
    cases.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": out, "text": tok.decode(out),
                  "min_top2_prob_gap": margin})
print(json.dumps({"generator": "glassllm 0.1.0 GlassLM.generate(greedy=True), float32", "cases": cases}, ensure_ascii=False, indent=1))
