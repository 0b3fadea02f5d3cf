"""ArcticInference's own suffix drafts, for comparison with methods/suffix.py. Run in the engine's Python.

stdin: one JSON object {"cases": [{"earlier": [[...], ...], "prompt": [...], "response": [...], "pattern_len": n}],
"max_depth", "max_spec_tokens", "max_spec_factor", "min_token_prob"}. Per case, a fresh cache: each earlier
sequence is a finished request (its response only enters the global tree, as vLLM's suffix proposer caches it),
then the request `prompt` starts and `response` is added; the draft for the last `pattern_len` tokens of
prompt + response is printed, one JSON line per case. Imports only the standard library and arctic_inference.
"""

import json
import sys

from arctic_inference.suffix_decoding import SuffixDecodingCache

job = json.loads(sys.stdin.read())
for case in job["cases"]:
    cache = SuffixDecodingCache(max_tree_depth=job["max_depth"], max_cached_requests=100)
    for i, earlier in enumerate(case["earlier"]):
        cache.start_request(f"earlier-{i}", [])
        cache.add_active_response(f"earlier-{i}", earlier)
        cache.stop_request(f"earlier-{i}")
    cache.start_request("now", case["prompt"])
    cache.add_active_response("now", case["response"])
    context = (case["prompt"] + case["response"])[-case["pattern_len"]:]
    draft = cache.speculate("now", context, max_spec_tokens=job["max_spec_tokens"],
                            max_spec_factor=job["max_spec_factor"], min_token_prob=job["min_token_prob"])
    print(json.dumps({"tokens": list(draft.token_ids), "probs": list(draft.probs), "match_len": draft.match_len,
                      "score": draft.score}))
