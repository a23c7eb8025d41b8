"""Visual gain: how much a page's visuals lower the perplexity of its own text (SPEC §A2).

Modules (heavy imports happen inside functions, importing this package is cheap):
- ``perplexity``: pure math from per-token NLLs to PPL, ΔH (nats and bits) and bits per page.
- ``adapters``: one interface over VLM families (Qwen2-VL / Qwen2.5-VL, LLaVA).
- ``scorer``: ``VisualGainScorer(config).load()`` / ``.run_batch(pages, model)``, two passes per page.
- ``thresholds``: per-domain thresholds file, domain classifier, keep/drop decision.
- ``review``: stratified export of pages near the threshold to static HTML, and the threshold fit.
- ``tiny``: the tiny random VLMs ``scifolio models tiny`` writes, for offline smoke runs.

    python -m pytest tests/visual_gain -q
"""
