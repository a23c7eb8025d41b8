"""``VLLMEngine``'s own bookkeeping (keep-mode pause, continue-in-place, resubmission, versions) under the real scheduler.

vLLM is not installed here (GPU only), so ``AsyncLLM`` is replaced by ``FakeAsyncLLM`` below: it implements the calls
the engine makes (``generate`` yielding CUMULATIVE outputs with ``weight_versions`` spans, ``pause_generation(mode=
"keep")`` freezing requests, ``resume_generation``, ``abort``, ``start/finish_weight_update``) with deterministic
tokens. What this does NOT exercise: real vLLM scheduling, KV-cache clearing, the IPC weight transfer, routed experts.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from types import SimpleNamespace

from test_vllm_mapping import CompletionOutput, Logprob, WeightVersionSpan

from posttrain.rollout.engines.vllm import VLLMApi, VLLMConfig, VLLMEngine
from posttrain.rollout.scheduler import PartialRolloutScheduler, Prompt, SchedulerConfig
from posttrain.rollout.types import Request, SamplingParams, Trajectory

STOP = 5


def fake_token(prompt_len: int, i: int, seed: int) -> int:
    return 3 + ((prompt_len + i) * 7 + seed) % 11


def fake_logprob(prompt_len: int, i: int) -> float:
    return -0.01 * (prompt_len + i + 1)


class FakeAsyncLLM:
    """Just enough of ``vllm.v1.engine.async_llm.AsyncLLM`` for the adapter (see the module docstring)."""

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(logprobs_mode="processed_logprobs")
        self.version = "default"
        self.paused = False
        self.aborted: set[str] = set()
        self.calls: list[str] = []
        self.prompts: dict[str, list[int]] = {}
        self.images: dict[str, list | None] = {}
        self.params: dict[str, object] = {}

    async def update_weight_version(self, v: str) -> None:
        self.version = v

    async def start_weight_update(self) -> None:
        assert self.paused, "weights updated while generating"
        self.calls.append("start_weight_update")

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(f"finish_weight_update:{weight_version}")
        self.version = weight_version

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        assert mode == "keep" and clear_cache
        self.calls.append("pause")
        self.paused = True

    async def resume_generation(self) -> None:
        self.calls.append("resume")
        self.paused = False

    async def abort(self, request_id) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.aborted.update(ids)

    async def generate(self, prompt, params, request_id):
        ids = prompt["prompt_token_ids"]
        self.prompts[request_id] = list(ids)
        self.images[request_id] = prompt.get("multi_modal_data", {}).get("image")
        self.params[request_id] = params
        tokens, lps, versions = [], [], []
        while len(tokens) < params.max_tokens:
            if request_id in self.aborted:
                yield SimpleNamespace(outputs=[self._out(tokens, lps, versions, "abort")])
                return
            await asyncio.sleep(0.0005)  # one "decode step"; a frozen (paused) request makes no progress
            if self.paused or request_id in self.aborted:
                continue
            i = len(tokens)
            tok = fake_token(len(ids), i, params.seed)
            tokens.append(tok)
            lps.append({tok: Logprob(fake_logprob(len(ids), i))})
            versions.append(self.version)
            stop = not params.ignore_eos and tok in params.stop_token_ids
            reason = "stop" if stop else "length" if len(tokens) >= params.max_tokens else None
            yield SimpleNamespace(outputs=[self._out(tokens, lps, versions, reason)])
            if reason:
                return

    @staticmethod
    def _out(tokens, lps, versions, reason):
        spans = []
        for k, v in enumerate(versions):
            if spans and spans[-1].version == v:
                spans[-1].end = k + 1
            else:
                spans.append(WeightVersionSpan(v, k, k + 1))
        return CompletionOutput(0, "", list(tokens), None, list(lps), None, reason, None, spans)

    def shutdown(self) -> None:
        pass


def make_engine(llm: FakeAsyncLLM, sent: list, capacity: int = 8, version: int = 0) -> VLLMEngine:
    async def start(_config):
        return llm

    async def sender(_llm, state):
        sent.append(dict(state))

    api = VLLMApi(start_llm=start, sampling_params=lambda **kw: SimpleNamespace(**kw), output_kind="cumulative")
    return VLLMEngine(VLLMConfig(model="fake", capacity=capacity, version=version, poll_timeout_s=5.0), sender, api)


class Prompts:
    def __init__(self) -> None:
        self.cursor = 0

    def next_prompt(self) -> Prompt:
        self.cursor += 1
        return Prompt(f"p{self.cursor}", [1] * (1 + self.cursor % 3))

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]


def test_scheduler_over_vllm_engine_keeps_paused_requests_inside_vllm():
    llm, sent = FakeAsyncLLM(), []
    engine = make_engine(llm, sent)
    sampling = SamplingParams(max_new_tokens=40, stop_token_ids=(STOP,))
    cfg = SchedulerConfig(batch_target=1, group_size=2, max_stale=3, dapo=False)
    sched = PartialRolloutScheduler(engine, Prompts(), lambda t: float(t.n_tokens % 2), sampling, cfg)
    trained = []
    try:
        for v in range(1, 4):
            batch = sched.collect()
            assert sched.paused and not any(t.finished for t in sched.paused)
            trained += [t for g in batch.groups for t in g]
            sched.sync({"w": v}, v)
    finally:
        engine.close()
    assert sent == [{"w": 1}, {"w": 2}, {"w": 3}]
    assert llm.calls.count("start_weight_update") == 3 and "finish_weight_update:3" in llm.calls
    assert engine.resubmissions == 0  # every paused trajectory continued inside vLLM (keep mode)
    for t in trained:
        t.validate()  # per-token fields agree, versions never decrease
        prompt_len = len(t.prompt_ids)
        assert t.logprobs == [fake_logprob(prompt_len, i) for i in range(t.n_tokens)]
    assert any(t.versions[0] < t.versions[-1] for t in trained)  # some responses span a weight sync


def test_resume_after_restart_resubmits_prompt_plus_kept_tokens():
    llm, sent = FakeAsyncLLM(), []
    engine = make_engine(llm, sent)
    params = SamplingParams(max_new_tokens=30, forced_length=30, seed=9)
    engine.submit([Request("r0", [1, 1, 1], params)])
    for _ in range(3):  # each step folds in at least one output, i.e. one more token
        engine.step()
    (paused,) = engine.pause()
    engine.close()
    kept = list(paused.token_ids)
    assert len(kept) >= 3 and all(v == 0 for v in paused.versions)

    # A new process: the request is gone from vLLM; the checkpointed trajectory is resubmitted.
    restored = Trajectory.from_dict(paused.to_dict())
    llm2 = FakeAsyncLLM()
    engine2 = make_engine(llm2, sent, version=1)  # restarted on the next policy version
    engine2.resume([restored])
    done = []
    while not done:
        done = engine2.step().finished
    engine2.close()
    (t,) = done
    assert engine2.resubmissions == 1
    (vid,) = llm2.prompts
    assert llm2.prompts[vid] == [1, 1, 1] + kept
    assert t.token_ids[: len(kept)] == kept and t.n_tokens == 30
    assert t.versions == [0] * len(kept) + [1] * (30 - len(kept))
    t.validate()


def test_a_vision_language_model_gets_each_image_once_with_its_placeholder():
    """On a served LLaVA (``hf_config`` with a vision tower), a request's images go to vLLM with one placeholder per
    image (vLLM expands it), the placeholder is never sampled, the trajectory keeps the expanded prompt the learner
    feeds."""
    from PIL import Image

    llm, sent = FakeAsyncLLM(), []
    llava = SimpleNamespace(vision_config=object(), image_token_index=7, image_seq_length=4)
    llm.model_config = SimpleNamespace(logprobs_mode="processed_logprobs", hf_config=llava)
    engine = make_engine(llm, sent)
    img = Image.new("RGB", (5, 5), (9, 9, 9))
    prompt = [1, 7, 7, 7, 7, 2]
    engine.submit([Request("v", prompt, SamplingParams(max_new_tokens=3, forced_length=3), images=(img,))])
    done = []
    while not done:
        done = engine.step().finished
    engine.close()
    ((vid, ids),) = llm.prompts.items()
    assert ids == [1, 7, 2] and llm.images[vid] == [img] and llm.params[vid].logit_bias == {7: -100.0}
    assert done[0].prompt_ids == prompt and done[0].n_tokens == 3


def test_abort_hands_back_and_stops_the_request():
    llm, sent = FakeAsyncLLM(), []
    engine = make_engine(llm, sent)
    engine.submit([Request("a", [1], replace(SamplingParams(), max_new_tokens=500, ignore_eos=True))])
    engine.step()
    (t,) = engine.abort(["a"])
    engine.close()
    assert t.finish_reason == "abort" and engine.n_active == 0
    assert any(vid.startswith("a@") for vid in llm.aborted)


def test_new_tokens_report_every_folded_id_once_across_a_pause():
    """``StepOutput.new_tokens`` (what the gateway streams): summed over steps, exactly each trajectory's ids, also
    when a pause folds outputs in (those are reported by the next step)."""
    llm, sent = FakeAsyncLLM(), []
    engine = make_engine(llm, sent)
    params = SamplingParams(max_new_tokens=120, forced_length=120)
    engine.submit([Request(f"n{i}", [1] * (i + 1), replace(params, seed=i)) for i in range(3)])
    reported: dict[str, list[int]] = {f"n{i}": [] for i in range(3)}
    finished = {}
    try:
        for k in range(2000):
            out = engine.step()
            for rid, ids in out.new_tokens.items():
                reported[rid] += ids
            finished.update((t.request_id, t) for t in out.finished)
            if k == 2:
                time.sleep(0.01)  # outputs pile up in the engine's queue: the pause folds them in
                paused = engine.pause()
                assert any(len(reported[t.request_id]) < t.n_tokens for t in paused)  # folded, not reported yet
                engine.resume(paused)
            if len(finished) == 3:
                break
    finally:
        engine.close()
    assert len(finished) == 3
    for rid, t in finished.items():
        assert t.n_tokens == 120 and reported[rid] == t.token_ids
