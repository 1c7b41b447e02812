"""The decoding core: sampling, acceptance rules, multi-draft rules, the decode loops with their
token-model and drafter protocols, the rule for continuous tokens (CSpD), the window policy,
statistics and the losslessness harness.

- ``checks``: the integer checks every layer shares;
- ``sampling``: logits -> the distributions drafts are sampled from and verified against;
- ``verify``: acceptance rules (speculative, greedy, typical, LANTERN, GSD, judge) and the default rule;
- ``judge``: judge decoding's rule object, which reads the target's features at the drafts;
- ``multidraft``: multi-draft rules (SpecTr, RSD, recursive i.i.d.), exact acceptance;
- ``proactive``: sibling trees (SJD-PAC's proactive drafting): layout, candidates, the exact walk;
- ``constraints``: structural tokens forced at fixed positions, allowed tokens elsewhere;
- ``rows``: the rows in flight and one decode call's run, shared by every loop;
- ``engine``: ``decode`` with the token-model and drafter protocols and ``Requests``;
- ``tree``: ``decode_tree`` (multi-draft trees) and the sibling-tree step of ``decode``;
- ``continuous``: CSpD's rule for continuous tokens and their loop, ``decode_continuous``;
- ``window``: choosing the window (``WindowPolicy``, ``WindowSearch``);
- ``window_costs``: measuring window costs and their disk cache;
- ``home``: the folder of what visualspec makes on this machine (``$VISUALSPEC_HOME``);
- ``stats``: ``DecodeStats``;
- ``lossless``: the losslessness harness (exact distributions, chi-square test).

It imports only torch (never diffusers or transformers) and nothing else of visualspec; every
other layer builds on it (docs/architecture.md).
"""
