"""The pure math of post-training (SPEC §C–D), a torch-only leaf: nothing here loads a model, drives an engine or
knows where it runs (``.importlinter`` keeps it so). Every SPEC worked example is a test of one of these modules.

| module | what |
|---|---|
| ``policy_loss`` | the detached-IS objective (Eq 29), clipping (Eq 11), the BKL mask (Eq 12–13) |
| ``advantages`` | LOO, DAPO filter, GEPO, adaptive length regularisation, their composition (Eq 25–28) |
| ``credit`` | agentic process weights and session credit (Eq 30) |
| ``distill`` | OPD advantage, per-domain routing, the distillation loss (Eq 31–36) |
| ``speculative`` | lossless speculative sampling, acceptance, the online draft loss (Eq 21–24) |
| ``memory_decoder`` | kNN distribution, memory loss, fusion and the trust router (Eq 1–4) |
| ``r3`` | routing record / replay hooks for MoE routers (SPEC C3) |
| ``lemma`` | verifier confidence, conjugate reward, lemma-graph propagation (SPEC §D) |
| ``native`` | the fused C kernel behind the hot loops of ``policy_loss`` and ``advantages`` |

    PYTHONPATH=. python -m pytest tests/posttrain/test_advantages.py tests/posttrain/test_policy_loss.py -q
"""
