"""Post-training (SPEC §C–D). A map, from the leaf up (imports flow upwards only):

- ``objectives/``: the pure math (policy loss, advantages, credit, distillation, speculative acceptance, Memory
  Decoder, R3, lemma rewards, the native kernel): torch only, a leaf.
- ``toolcall``: the tool-call markup (``<tool_call>{json}</tool_call>``): rendered, templated and parsed from this
  one definition by the tiny template, the gateway and the scripted agents; a leaf.
- ``tiny/``: every tiny random model and tokenizer the tests and smoke runs build (``scifolio models tiny``).
- ``rollout/``: the ``RolloutEngine`` protocol, its engines (HF, speculative, vLLM, scripted) and the
  partial-rollout scheduler.
- ``rl/``: the one driver (``loop.run_stage``) and its stages; ``engines`` (kind × placement → engine factory),
  ``learner`` (Eq 28–29, BKL at matched weights, R3 replay, AdamW/Muon), ``recipes``, ``distill`` (OPD stage),
  ``teachers``, ``draft`` (online speculative draft), ``task`` (verifiable tasks).
- ``agentic/``: the model gateway (three protocols), trace store, harness × task, and the agentic stage.
- ``memdec/``: the Memory Decoder pipeline (datastore, memory LM, router, fused model, evaluation).
- ``ray_actors``: the one module that imports Ray (engine workers behind one ``RolloutEngine``).

    scifolio posttrain rl | agentic | distill --config debug --out DIR [--resume]
    scifolio posttrain gateway --model DIR ; scifolio posttrain memdec all --work DIR
"""
