"""gates.yaml texts shared by tests that run the whole flow on the tiny model."""

from __future__ import annotations

# hopper-fp8 required; every artifact of a working build passes (the `support` tenant is named by
# eval_suites/support-domain.yaml, so it must exist), judged on wikitext alone
LENIENT_HOPPER = """\
version: 1
model_classes:
  draft:
    description: the tiny test model's class
    match: {moe: false, max_params: 1.5e9}
    targets: {required: [hopper-fp8]}
    kv_cache: bf16
tenants:
  lenient:
    description: every artifact of a working build passes
    floors: [{suite: wikitext, metric: kld_mean, max: 10.0}]
  support:
    description: named by eval_suites/support-domain.yaml; judged on wikitext here
    floors: [{suite: wikitext, metric: kld_mean, max: 10.0}]
"""
