"""The decoding core: sampling, acceptance rules, multi-draft rules, the one decode engine with its
token-model and drafter protocols, the rule for continuous tokens (CSpD), the window policy, statistics and the losslessness harness.

It imports only torch (never diffusers or transformers) and nothing else of visualspec; every
other layer builds on it (docs/architecture.md).
"""
