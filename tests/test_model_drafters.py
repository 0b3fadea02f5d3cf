"""Every model-based drafter, distilled on the spot to a tiny Llama and Qwen3 target so that it accepts most
tokens: greedy output equals the baseline's (trees and chains, one and two turns), and sampling keeps the
target's distribution. Format and algorithm checks live in each method's own test file."""

from __future__ import annotations

import pytest

from tests.drafter_fixtures import SAMPLING_TEMPERATURE, make_method
from tests.helpers import assert_lossless, assert_multi_turn_lossless, sampling_p_value

ARCHS = ("llama", "qwen3")
# method -> [(options, minimum accepted drafts out of 150 tokens, check on the rounds)]
VARIANTS = {
    "eagle3": [({}, 80, lambda r: max(x.tree_size for x in r) == 59),
               ({"top_k": 1, "depth": 6, "total_token": 7}, 80, lambda r: all(x.tree_size <= 6 for x in r)),
               ({"top_k": 4, "depth": 8, "total_token": 32}, 80, lambda r: max(x.tree_size for x in r) == 31)],
    "dflash": [({}, 40, lambda r: all(x.tree_size == 7 and x.draft_depth == 7 for x in r)),
               ({"block_size": 4}, 40, lambda r: all(x.tree_size == 3 for x in r) and max(x.accepted for x in r) >= 2)],
    "dart": [({}, 80, lambda r: max(x.tree_size for x in r) == 60 and max(x.draft_depth for x in r) <= 5),
             ({"trie": "none"}, 80, lambda r: max(x.tree_size for x in r) == 60),
             ({"total": 8, "beam_width": 2, "top_k": 3}, 80, lambda r: max(x.tree_size for x in r) == 8)],
    "confu": [({}, 80, lambda r: all(x.target_forwards == 1 for x in r)),
              ({"top_k": 1, "depth": 6, "total_token": 7}, 80, lambda r: all(x.tree_size <= 6 for x in r))],
}
CASES = [(m, i, a) for m, variants in VARIANTS.items() for i in range(len(variants)) for a in ARCHS]
# small trees keep the distribution test (600 sampled decodes) fast
# (method, options); DFlash in both of its T > 0 schemes: argmax drafts (the reference's) and sampled drafts
SAMPLING = [("eagle3", {"top_k": 4, "depth": 3, "total_token": 16}), ("dflash", {"block_size": 4}),
            ("dflash", {"block_size": 4, "sampling": "sample"}), ("dart", {"total": 12, "beam_width": 4, "top_k": 5}),
            ("confu", {"top_k": 4, "depth": 3, "total_token": 16})]


@pytest.mark.parametrize("method,variant,arch", CASES)
def test_lossless_and_accepting(distilled, method, variant, arch):
    target, corpus, folder = distilled(method, arch)
    opts, min_accepted, check = VARIANTS[method][variant]
    result = assert_lossless(target, make_method(method, target, folder, **opts), corpus[0][:24], min_accepted=min_accepted)
    assert check(result.rounds), opts
    assert all(r.phases["draft_head"] > 0 for r in result.rounds)


@pytest.mark.parametrize("method", VARIANTS)
@pytest.mark.parametrize("arch", ARCHS)
def test_multi_turn_is_lossless(distilled, method, arch):
    target, corpus, folder = distilled(method, arch)
    assert_multi_turn_lossless(target, make_method(method, target, folder), corpus[1][:24])


@pytest.mark.slow
@pytest.mark.parametrize("method,opts", SAMPLING)
def test_sampling_keeps_the_target_distribution(distilled, method, opts):
    target, corpus, folder = distilled(method, "llama")
    make = lambda: make_method(method, target, folder, **opts)  # noqa: E731
    assert sampling_p_value(target, make, corpus[0][:24], SAMPLING_TEMPERATURE) > 1e-3
