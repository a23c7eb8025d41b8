"""``scifolio eval``: the unbiased pass@k estimator, a scripted policy of known success rate, verifiers, the CLI on
the real HF engine, and perplexity on shards."""

from __future__ import annotations

import json
import math
import random
import threading
from collections import deque
from pathlib import Path

import pytest

from posttrain.eval import EvalTask, evaluate, pass_at_k
from posttrain.rl.task import exact_match as exact
from posttrain.rl.task import math_verify, numeric
from posttrain.rollout.engine import StepOutput
from posttrain.rollout.types import FINISH_LENGTH, FINISH_STOP, Trajectory


@pytest.mark.parametrize(
    ("n", "c", "k", "want"),
    [
        (5, 0, 1, 0.0),
        (5, 5, 3, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
        (10, 3, 4, 5 / 6),  # 1 − C(7,4)/C(10,4) = 1 − 35/210
        (16, 2, 16, 1.0),
        (16, 1, 4, 0.25),  # 1 − C(15,4)/C(16,4) = 1 − 1365/1820
    ],
)
def test_pass_at_k_hand_made_counts(n: int, c: int, k: int, want: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_equals_closed_form_everywhere() -> None:
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                closed = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


class CoinPolicy:
    """A scripted engine: each request answers its problem correctly with that problem's probability, else says
    something wrong; decided by a generator seeded from the request's seed, one token per step."""

    def __init__(self, tokenizer, rates: dict[str, float], answers: dict[str, str]) -> None:
        self.tok, self.rates, self.answers = tokenizer, rates, answers
        self.queue: deque[tuple[Trajectory, list[int]]] = deque()

    def submit(self, requests) -> None:
        for r in requests:
            rng = random.Random(r.params.seed)
            good = rng.random() < self.rates[r.group_id]
            text = self.answers[r.group_id] if good else self.answers[r.group_id][::-1] + "9"
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            self.queue.append((Trajectory(request=r), ids))

    def step(self) -> StepOutput:
        out = StepOutput()
        for _ in range(len(self.queue)):
            traj, ids = self.queue.popleft()
            tok = ids[traj.n_tokens]
            traj.append(tok, 0.0, 0)
            if tok in traj.request.params.stop_token_ids:
                traj.finish_reason = FINISH_STOP
            elif traj.n_tokens >= traj.request.params.max_new_tokens:
                traj.finish_reason = FINISH_LENGTH
            if traj.finish_reason:
                out.finished.append(traj)
            else:
                self.queue.append((traj, ids))
        return out


def test_scripted_policy_reproduces_its_success_rate_within_binomial_error() -> None:
    from posttrain.rl.task import char_tokenizer

    tok = char_tokenizer()
    rng = random.Random(7)
    rows = [{"id": f"p{i}", "prompt": f"{i % 9 + 1}:", "answer": str(rng.randrange(10, 99))} for i in range(60)]
    rates = {r["id"]: rng.choice([0.05, 0.2, 0.5, 0.8]) for r in rows}
    answers = {r["id"]: r["answer"] for r in rows}
    task = EvalTask(rows, exact, max_new_tokens=8)
    n, ks, repeats = 16, [1, 4, 16], 2
    out = evaluate(lambda: CoinPolicy(tok, rates, answers), tok, task, n, ks, repeats=repeats, progress=False)
    for k in ks:
        true = sum(1 - (1 - p) ** k for p in rates.values()) / len(rows)
        # A problem's estimate has variance ≤ q(1 − q) (a [0, 1] variable of mean q): 4 σ of the mean over problems.
        sigma = math.sqrt(sum((1 - (1 - p) ** k) * (1 - p) ** k for p in rates.values())) / len(rows)
        assert abs(out[f"pass@{k}"] - true) < 4 * sigma / math.sqrt(repeats) + 1e-9, (k, out[f"pass@{k}"], true)
    # pass@1 specifically is a binomial proportion over 60 × 16 × 2 samples.
    p1 = sum(rates.values()) / len(rows)
    assert abs(out["pass@1"] - p1) < 4 * math.sqrt(p1 * (1 - p1) / (len(rows) * n * repeats))
    run = out["runs"][0]
    assert len(run["problems"]) == 60 and all(p["n"] == n and len(p["samples"]) == n for p in run["problems"])
    first = run["problems"][0]
    assert first["correct"] == sum(s["passed"] for s in first["samples"])
    assert first["pass@4"] == pytest.approx(pass_at_k(n, first["correct"], 4))
    assert out["runs"][0]["problems"] != out["runs"][1]["problems"]  # repeats draw fresh samples


def test_verifiers() -> None:
    row = {"answer": "0.5"}
    assert numeric("so the answer is 1/2 = 0.50", row, True) and not numeric("0.5 then 0.6", row, True)
    assert not numeric("0.5", row, False)  # truncated responses never pass
    assert exact(" 42 ", {"answer": 42}, True) and not exact("42", {"answer": 42}, False)
    assert math_verify("The result is $\\frac{1}{2}$", row, True)
    assert math_verify("$(x+1)^2$", {"answer": "x^2+2x+1"}, True)
    assert not math_verify("$x^2+1$", {"answer": "x^2+2x+1"}, True)
    # Off the main thread math-verify's SIGALRM timeouts are switched off instead of raising.
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(math_verify("\\boxed{\\frac{2}{4}}", row, True)))
    t.start()
    t.join()
    assert got == [True]


@pytest.fixture(scope="module")
def char_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from posttrain.rl.task import char_tokenizer
    from posttrain.tiny.lm import causal_lm

    torch.manual_seed(0)
    tok = char_tokenizer()
    model = causal_lm(len(tok), 32, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = tmp_path_factory.mktemp("char-lm")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_cli_eval_countdown_on_hf_engine(char_model: Path, tmp_path: Path, capsys, one_torch_thread) -> None:
    from pipelines.cli import main

    out = tmp_path / "eval.json"
    argv = ["eval", "--model", str(char_model), "--task", "countdown", "--problems", "6", "--n", "4"]
    assert main([*argv, "--k", "1,4", "--max-new-tokens", "6", "--out", str(out), "--no-progress"]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("countdown: pass@1 ") and "6 problems, n=4" in said[0]
    res = json.loads(out.read_text())
    problems = res["runs"][0]["problems"]
    assert len(problems) == 6 and all(len(p["samples"]) == 4 for p in problems)
    assert all(len(s["text"]) <= 6 for p in problems for s in p["samples"])
    # The summary is the mean of the per-problem estimates, and each problem's count is its passed samples.
    for k in (1, 4):
        assert res[f"pass@{k}"] == pytest.approx(sum(p[f"pass@{k}"] for p in problems) / 6)
    for p in problems:
        assert p["correct"] == sum(s["passed"] for s in p["samples"])
    assert main([*argv, "--k", "1,8", "--out", str(out), "--no-progress"]) == 2  # k > n refused


def test_cli_perplexity_on_shards(tmp_path: Path, capsys, one_torch_thread) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.cli import main
    from posttrain.tiny.lm import causal_lm
    from tests.pretrain.fixtures import write_corpus

    torch.manual_seed(0)
    causal_lm(64, 32).save_pretrained(tmp_path / "lm")
    from posttrain.rl.task import char_tokenizer

    char_tokenizer().save_pretrained(tmp_path / "lm")
    write_corpus(tmp_path / "build", n_docs=4, n_shards=1, vocab=64, pages=False)
    out = tmp_path / "ppl.json"
    args = ["eval", "--model", str(tmp_path / "lm"), "--task", "perplexity", "--shards", str(tmp_path / "build")]
    assert main([*args, "--seq-len", "64", "--out", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith("perplexity ")
    res = json.loads(out.read_text())
    # Recompute with the model's own loss (mean over each window's shifted targets), token-weighted.
    from formats.shards import iter_chunks, list_shards

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval()
    total, count = 0.0, 0
    for chunk in iter_chunks(list_shards(tmp_path / "build")[0]):
        ids = [t for s in chunk.segments if s.kind == "text" for t in s.token_ids]
        for start in range(0, len(ids) - 1, 64):
            w = torch.tensor([ids[start : start + 64]])
            if w.shape[1] > 1:
                with torch.no_grad():
                    total += model(input_ids=w, labels=w).loss.item() * (w.shape[1] - 1)
                count += w.shape[1] - 1
    assert res["tokens"] == count and res["chunks"] == 4
    assert res["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-4)
    assert 1 < res["perplexity"] < 200  # a random 64-token model: near its vocabulary size


def test_chat_response_stops_at_the_templates_turn_end() -> None:
    from formats.chat import CHAT_TEMPLATE
    from posttrain.rl.task import char_tokenizer

    tok = char_tokenizer("0123456789:<|>_imendrsaty\n ")
    tok.chat_template = CHAT_TEMPLATE
    rows = [{"id": "c0", "messages": [{"role": "user", "content": "1:"}], "answer": "12"}]

    class NoEos(CoinPolicy):  # the right answer, the turn end as text, then chatter until the budget runs out
        def submit(self, requests) -> None:
            for r in requests:
                ids = self.tok("12<|im_end|>\n<|im_start|>user 99", add_special_tokens=False)["input_ids"]
                self.queue.append((Trajectory(request=r), ids))

    out = evaluate(lambda: NoEos(tok, {}, {}), tok, EvalTask(rows, exact, 24), 2, [1], progress=False)
    samples = out["runs"][0]["problems"][0]["samples"]
    assert [s["text"] for s in samples] == ["12", "12"] and out["pass@1"] == 1.0


def test_lemma_chain_family_is_an_eval_task_scored_at_pass_1_and_4_over_16() -> None:
    """``scifolio eval --task lemma-chain``: the lemma agent's test split, checked by the family's own verifier."""
    from posttrain.eval import TASKS, TaskOptions
    from posttrain.tiny.agentic import build_tokenizer

    tok = build_tokenizer()
    task = TASKS["lemma-chain"](TaskOptions(problems=12, seed=0))
    assert len(task.rows) == 12 and all("answer" in r for r in task.rows)
    rates = {r["id"]: (0.25 if i % 2 else 0.75) for i, r in enumerate(task.rows)}
    answers = {r["id"]: f"ANSWER: {r['answer']}" for r in task.rows}
    out = evaluate(lambda: CoinPolicy(tok, rates, answers), tok, task, 16, [1, 4], progress=False)
    for k in (1, 4):
        true = sum(1 - (1 - p) ** k for p in rates.values()) / len(rates)
        sigma = math.sqrt(sum((1 - (1 - p) ** k) * (1 - p) ** k for p in rates.values())) / len(rates)
        assert abs(out[f"pass@{k}"] - true) < 4 * sigma + 1e-9, (k, out[f"pass@{k}"], true)


def test_agentic_eval_of_a_scripted_policy_reproduces_its_success_rate(tmp_path: Path) -> None:
    """Sessions through the gateway and the harness, graded by the hidden tests in the jail: a policy that fixes the
    code on even sessions and games the visible tests on odd ones passes exactly half (pass@1 0.5, pass@2 1)."""
    from posttrain.agentic.rl import ScriptedAgent, behaviour_replies
    from posttrain.eval import evaluate_agentic
    from posttrain.rollout.engines.scripted import ScriptedTokenEngine
    from posttrain.tiny.agentic import build_tokenizer

    tok = build_tokenizer()
    agent = ScriptedAgent(tok)

    def script(session: str, task) -> None:  # noqa: ANN001
        agent.assign(
            session, behaviour_replies(task, "fix" if int(session.rsplit(":", 1)[1]) % 2 == 0 else "edit_tests")
        )

    res = evaluate_agentic(
        lambda: ScriptedTokenEngine(agent), tok, n=2, ks=[1, 2], tasks=1, on_session=script, progress=False
    )
    assert res["problems_count"] == 1 and res["infra"] == 0
    assert res["pass@1"] == 0.5 and res["pass@2"] == 1.0
    (problem,) = res["runs"][0]["problems"]
    assert [s["passed"] for s in problem["samples"]] == [True, False]


def test_cli_eval_agentic_on_a_tiny_model_and_vllm_refused(tmp_path: Path, capsys, one_torch_thread) -> None:
    from pipelines.cli import main
    from posttrain.tiny.agentic import write_tiny_agentic

    model = write_tiny_agentic(tmp_path / "m")
    out = tmp_path / "agentic.json"
    argv = ["eval", "--model", str(model), "--task", "agentic", "--problems", "1", "--n", "1", "--k", "1"]
    argv += ["--max-turns", "2", "--max-new-tokens", "8", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("agentic: pass@1 ") and "1 tasks, n=1" in said
    res = json.loads(out.read_text())
    assert res["task"] == "agentic" and len(res["runs"][0]["problems"][0]["samples"]) == 1
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert main([*argv[:-3], "--engine", "vllm", "--out", str(out)]) == 2
        assert "vLLM is not installed" in capsys.readouterr().err
