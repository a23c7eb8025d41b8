"""Speculative vs plain decoding on the HF engines (issue 14): tokens per policy forward and wall time.

    python benchmarks/specdec.py --embed 400      # 183M policy, 17.3M random draft (10.6x smaller), K=4; ~2.5 min, 2 cores
    python benchmarks/specdec.py --embed 400 --draft-from-policy   # the draft starts as the policy's early exit
    python benchmarks/specdec.py --layers 4 --hidden 512 --tokens 32   # quick smoke run

The policy is a Qwen2 built from a config with random weights: its head is scaled by ``--sharpen`` (peaked
next-token laws) and its token embeddings by ``--embed`` (the token then dominates the residual stream, so
the next-token law is close to a function of the last token: a learnable stand-in for a trained LM; the
larger ``--embed``, the more predictable). The draft is a separate Qwen2 with random weights
(``--draft-hidden`` × ``--draft-layers``; ``--draft-from-policy`` starts it instead as an early exit of the
policy: its embeddings, first ``--draft-layers`` blocks, final norm and head) and is trained ONLINE as in RL: speculative rollouts on the ``SpeculativeEngine``, each followed by
``DraftTrainer.update`` on the states just collected (hybrid KL/TV, λ_k from the running acceptance), up to
``--max-iters`` or ``--target-acceptance``. Then the same requests (batch 1, fixed length, same seeds) are
decoded alternately by the plain ``HFEngine`` and by the ``SpeculativeEngine``. Printed: per-position
acceptance a, tokens per policy forward, wall times and the measured speed-up next to the theory
``(1 − a^{K+1})/(1 − a)`` tokens per round (an upper bound: it ignores the draft's K forwards and that on a
CPU a (K+1)-token verify forward costs ~1.9x a 1-token one).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from posttrain.objectives.speculative import expected_tokens_per_round
from posttrain.rl.draft import DraftTrainer
from posttrain.rollout.engines.hf import HFEngine
from posttrain.rollout.engines.speculative import SpeculativeConfig, SpeculativeEngine
from posttrain.rollout.types import Request, SamplingParams


def lm(vocab: int, hidden: int, layers: int, seed: int, sharpen: float = 1.0, embed: float = 1.0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64),
        num_key_value_heads=max(2, hidden // 256),
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(sharpen)
        m.model.embed_tokens.weight.mul_(embed)
    return m


def n_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def requests(tag: str, n: int, length: int, vocab: int, seed: int) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    return [
        Request(
            f"{tag}{i}",
            torch.randint(0, vocab, (8,), generator=g).tolist(),
            SamplingParams(max_new_tokens=length, ignore_eos=True, seed=seed * 1000 + i),
        )
        for i in range(n)
    ]


def drain(engine) -> list:  # noqa: ANN001
    done = []
    while engine.n_active:
        done += engine.step().finished
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=1024, help="policy width")
    ap.add_argument("--layers", type=int, default=12, help="policy depth")
    ap.add_argument("--draft-hidden", type=int, default=768, help="random draft width (without --draft-from-policy)")
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument(
        "--draft-from-policy",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="initialise the draft as the policy's first --draft-layers blocks + embeddings + head (early exit)",
    )
    ap.add_argument("--sharpen", type=float, default=8.0, help="policy lm_head scale (peakedness)")
    ap.add_argument(
        "--embed",
        type=float,
        default=10.0,
        help="policy embedding scale: the token dominates the residual stream, so the next-token law is close to "
        "a function of the last token (a learnable stand-in for a trained LM; 1 = fully random contexts)",
    )
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per timed request")
    ap.add_argument("--requests", type=int, default=6, help="timed requests (batch 1, one after another)")
    ap.add_argument("--train-batch", type=int, default=16, help="requests per online draft iteration")
    ap.add_argument("--train-tokens", type=int, default=32)
    ap.add_argument("--max-iters", type=int, default=14)
    ap.add_argument(
        "--target-acceptance", type=float, default=0.85, help="stop online training once a rollout reaches it"
    )
    ap.add_argument(
        "--distill-seqs", type=int, default=0, help="random contexts to distil the draft on first (0: none)"
    )
    ap.add_argument("--distill-len", type=int, default=64)
    ap.add_argument("--distill-epochs", type=int, default=10)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--draft-steps", type=int, default=30, help="Adam steps per online iteration")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the policy's weights (both engines decode with it); the draft stays float32 (it is trained). On a "
        "CPU with AMX, bfloat16 makes a (K+1)-token verify forward cost about a 1-token one",
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    policy = lm(args.vocab, args.hidden, args.layers, seed=0, sharpen=args.sharpen, embed=args.embed)
    if args.draft_from_policy:
        # Early-exit draft: the policy's embeddings, first ``draft_layers`` blocks, final norm and head (then trained).
        draft = lm(args.vocab, args.hidden, args.draft_layers, seed=1)
        own = draft.state_dict()
        draft.load_state_dict({k: v.clone() for k, v in policy.state_dict().items() if k in own})
    else:
        draft = lm(args.vocab, args.draft_hidden, args.draft_layers, seed=1)
    policy.to(getattr(torch, args.dtype))  # the draft (copied above in float32 if from the policy) stays float32
    print(
        f"policy {n_params(policy) / 1e6:.1f}M params ({args.dtype}), draft {n_params(draft) / 1e6:.1f}M "
        f"({n_params(policy) / n_params(draft):.1f}x smaller), vocab {args.vocab}, K={args.k}, "
        f"{args.threads} threads; built in {time.perf_counter() - t0:.1f}s"
    )

    cfg = SpeculativeConfig(enabled=True, k=args.k, draft_lr=args.draft_lr, draft_steps=args.draft_steps)
    eng = SpeculativeEngine(policy, draft, k=args.k, capacity=args.train_batch)
    trainer = DraftTrainer(draft, cfg)
    # -- distil the draft first on the policy's distributions at random contexts (one policy prefill, cached) ----
    t0 = time.perf_counter()
    if args.distill_seqs:
        g = torch.Generator().manual_seed(12345)
        ids = torch.randint(0, args.vocab, (args.distill_seqs, args.distill_len), generator=g)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            target = torch.cat([policy(input_ids=ids[i : i + 8]).logits.float() for i in range(0, len(ids), 8)])
        wins = [
            (r, s, min(args.k, args.distill_len - s))
            for r in range(len(ids))
            for s in range(0, args.distill_len, args.k)
        ]
        for _ in range(args.distill_epochs):
            m = trainer.fit(ids, mask, wins, target)
        print(
            f"distilled the draft first: {args.distill_seqs}x{args.distill_len} random-context states, "
            f"{args.distill_epochs}x{cfg.draft_steps} steps, last loss {m['draft_loss']:.3f}, {time.perf_counter() - t0:.1f}s"
        )
    # -- online draft training on the speculative engine's own rollouts ------------------------------------------
    t0 = time.perf_counter()
    for it in range(args.max_iters):
        eng.submit(requests(f"t{it}-", args.train_batch, args.train_tokens, args.vocab, seed=100 + it))
        a0, p0 = eng.accepted, eng.reached
        done = drain(eng)
        acc = (eng.accepted - a0) / max(1, eng.reached - p0)
        trainer.observe(eng.take_round_log())
        m = trainer.update(done, policy)
        eng.update_draft(trainer.weights(), trainer.version)
        print(f"  online draft iter {it:2d}: acceptance of this rollout {acc:.3f}, draft loss {m['draft_loss']:.3f}")
        if acc >= args.target_acceptance:
            break
    print(f"online draft training: {it + 1} iterations, {time.perf_counter() - t0:.1f}s")

    # -- timed: the same requests, plain vs speculative --------------------------------------------------------
    timed = requests("bench", args.requests, args.tokens, args.vocab, seed=7)
    plain = HFEngine(policy, capacity=1)
    spec = SpeculativeEngine(policy, draft, k=args.k, capacity=1)
    drain_one = [copy.deepcopy(timed[0])]
    plain.submit(drain_one)  # warm-up (allocator, first-call overheads), not timed
    drain(plain)
    # Alternate plain and speculative per request (shared machine: load changes within seconds); medians of pairs.
    t_plain, t_spec, ratios = 0.0, 0.0, []
    plain.steps = 0
    for r in timed:
        t0 = time.perf_counter()
        plain.submit([copy.deepcopy(r)])
        drain(plain)
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        spec.submit([copy.deepcopy(r)])
        drain(spec)
        ts = time.perf_counter() - t0
        t_plain, t_spec = t_plain + tp, t_spec + ts
        ratios.append(tp / ts)
        print(f"  request {r.request_id}: plain {tp:.2f}s, speculative {ts:.2f}s, ratio {tp / ts:.2f}x")
    plain_forwards = plain.steps
    n_tok = args.requests * args.tokens
    a = spec.acceptance
    print(f"timed: {args.requests} requests x {args.tokens} tokens, batch 1")
    print(
        f"  plain       : {plain_forwards} policy forwards, {n_tok / plain_forwards:.2f} tokens/forward, {t_plain:.2f}s"
    )
    print(
        f"  speculative : {spec.policy_forwards} policy forwards (incl. {args.requests} prefills), "
        f"{n_tok / spec.policy_forwards:.2f} tokens/forward, {t_spec:.2f}s; acceptance a = {a:.3f}, "
        f"{spec.emitted / max(1, spec.rounds):.2f} tokens/round"
    )
    theory = float(expected_tokens_per_round(a, args.k))
    print(
        f"  speed-up    : {t_plain / t_spec:.2f}x wall-clock (median of per-request pairs "
        f"{sorted(ratios)[len(ratios) // 2]:.2f}x); theory (1 - a^(K+1))/(1 - a) = {theory:.2f} tokens/round "
        f"(an upper bound on the speed-up: it ignores the draft's K forwards per round)"
    )


if __name__ == "__main__":
    main()
