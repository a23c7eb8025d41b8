"""The RL step on a real model (issue 40 §2): rollout engine vs ``model.generate``, learner vs a bare step.

    scifolio models real real/ && python benchmarks/rollout_real.py --model real/lm     # ~3 min, 1 thread
    python benchmarks/rollout_real.py --model real/lm --tokens 16 --threads 2

Both sides in one run, alternating, on the same prompts (SmolLM2's chat template over arithmetic questions) and
the same sampling (temperature 1, top-p 1, exactly ``--tokens`` new tokens each: the engine's ``forced_length``,
``generate``'s ``min_new_tokens``):

1. **Decoding.** ``HFEngine`` (per-request KV caches, a step-driven batch) vs ``model.generate`` with its KV
   cache (``use_cache=True``, left-padded batch), at batch 16 (16 prompts at once) and batch 1 (the same 16
   prompts one by one). Printed: tokens/s of each and ``engine / generate`` (targets: ≥ 1.0 at batch 16, ≥ 0.9
   at batch 1).
2. **Learner.** ``Learner.train`` on a batch of the engine's own rollouts (2 groups × 8, rewards alternating
   0/1 so no advantage is zero; ``n_minibatches=1``: one optimizer step) vs a bare forward + backward + AdamW
   step over the same packed tokens (``-mean logprob`` of the response tokens). Printed: s/step of each and
   ``learner / bare`` (target ≤ 1.5). The learner's step also re-scores every token once without gradients
   (the BKL mask at matched weights) and shapes advantages: that is what the ratio prices.

The weights are SmolLM2-135M-Instruct **dequantized from Q4_1** (``scifolio models real``): real but lossy; the
timings do not depend on it. Results go in ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` chat prompts (integer arithmetic, as the RL recipes use) through the model's chat template."""
    out = []
    for i in range(n):
        a, b = 3 + 7 * i, 11 + 5 * i
        msgs = [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def engine_decode(model, ids: list[list[int]], batch: int, tokens: int, seed: int) -> float:
    """Seconds for the HF engine to produce ``tokens`` tokens for every prompt, ``batch`` prompts at a time."""
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.types import Request, SamplingParams

    t0 = time.perf_counter()
    for start in range(0, len(ids), batch):
        engine = HFEngine(model, capacity=batch)
        params = [
            SamplingParams(max_new_tokens=tokens, forced_length=tokens, seed=seed + start + j) for j in range(batch)
        ]
        engine.submit([Request(f"r{start + j}", p, params[j]) for j, p in enumerate(ids[start : start + batch])])
        done = 0
        while done < len(ids[start : start + batch]):
            done += len(engine.step().finished)
    return time.perf_counter() - t0


def generate_decode(model, tokenizer, ids: list[list[int]], batch: int, tokens: int, seed: int) -> float:
    """Seconds for ``model.generate`` (KV cache, sampling at temperature 1) on the same prompts and lengths."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t0 = time.perf_counter()
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        width = max(len(p) for p in chunk)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        torch.manual_seed(seed + start)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                use_cache=True,
                pad_token_id=pad,
            )
        assert out.shape[1] == width + tokens
    return time.perf_counter() - t0


def rollout_batch(model, ids: list[list[int]], tokens: int):
    """Two groups of 8 of the engine's rollouts (the learner needs behaviour logprobs), rewards 0/1 alternating."""
    from posttrain.rollout.engines.hf import HFEngine
    from posttrain.rollout.scheduler import Batch
    from posttrain.rollout.types import Request, SamplingParams

    engine = HFEngine(model, capacity=16)
    reqs = []
    for g in range(2):
        for j in range(8):
            params = SamplingParams(max_new_tokens=tokens, forced_length=tokens, seed=100 * g + j)
            reqs.append(Request(f"g{g}-{j}", ids[g], params, group_id=f"g{g}"))
    engine.submit(reqs)
    done = []
    while len(done) < len(reqs):
        done += engine.step().finished
    groups = []
    for g in range(2):
        members = sorted((t for t in done if t.group_id == f"g{g}"), key=lambda t: int(t.request_id.rsplit("-", 1)[1]))
        for j, t in enumerate(members):
            t.reward = float(j % 2)
        groups.append(members)
    return Batch(groups=groups, version=0)


def bare_step(model, opt, packed) -> None:
    """One forward + backward + AdamW step on the packed tokens: -mean logprob of the response tokens."""
    logits = model(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits
    lp = torch.log_softmax(logits.float(), dim=-1)
    rows = torch.arange(packed.tokens.shape[0])[:, None]
    tok = lp[rows, packed.positions, packed.tokens]
    loss = -(tok * packed.response_mask).sum() / packed.response_mask.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a causal LM directory (scifolio models real DIR → DIR/lm)")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per prompt (default 32)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts (batch 16 decodes them at once; default 16)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1, as the RL recipes)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of each side; the median is kept")
    ap.add_argument("--learner-steps", type=int, default=3, help="timed steps of the learner and of the bare loop")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.rl.learner import Learner, LearnerConfig, pack

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    ids = prompts(tokenizer, args.prompts)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model {args.model}: {n_params / 1e6:.1f}M params, fp32, {args.threads} thread(s); {len(ids)} prompts "
        f"× {args.tokens} tokens, temperature 1"
    )

    n_tok = len(ids) * args.tokens
    engine_decode(model, ids[:2], 2, 4, seed=0)  # warm-up: first-call allocations on both sides
    generate_decode(model, tokenizer, ids[:2], 2, 4, seed=0)
    for batch in (min(16, len(ids)), 1):
        e_s, g_s = [], []
        for r in range(args.repeats):
            e_s.append(engine_decode(model, ids, batch, args.tokens, seed=r * 1000))
            g_s.append(generate_decode(model, tokenizer, ids, batch, args.tokens, seed=r * 1000))
        e, g = statistics.median(e_s), statistics.median(g_s)
        print(
            f"decode batch {batch:>2}: engine {n_tok / e:7.1f} tok/s ({e:.2f} s)   generate {n_tok / g:7.1f} tok/s "
            f"({g:.2f} s)   engine/generate {g / e:.2f}x   (target >= {1.0 if batch > 1 else 0.9})"
        )

    batch = rollout_batch(model, ids, args.tokens)
    learner = Learner(copy.deepcopy(model), LearnerConfig(lr=1e-6, n_minibatches=1), temperature=1.0)
    bare_model = copy.deepcopy(model).train()
    opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-6)
    packed = pack([t for g in batch.groups for t in g], 0)
    bare_step(bare_model, opt, packed)  # warm-up (optimizer state allocation) on both sides
    batch.version = learner.version
    learner.train(batch)
    l_s, b_s = [], []
    for _ in range(args.learner_steps):
        batch.version = learner.version
        t0 = time.perf_counter()
        learner.train(batch)
        l_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare_step(bare_model, opt, packed)
        b_s.append(time.perf_counter() - t0)
    lm, bm = statistics.median(l_s), statistics.median(b_s)
    n, T = packed.input_ids.shape
    print(
        f"learner step ({n} sequences × {T} tokens): Learner.train {lm:.2f} s   bare fwd+bwd+AdamW {bm:.2f} s   "
        f"learner/bare {lm / bm:.2f}x   (target <= 1.5)"
    )


if __name__ == "__main__":
    main()
