"""The GPU rollout engine: vLLM's ``AsyncLLM`` behind the ``RolloutEngine`` protocol (SPEC §C1–C3).

vLLM is imported lazily (``pip install vllm`` on a GPU machine; it is not a dependency of this project and
is not installed in CI). The pieces that matter for partial rollout:

- **pause / resume**: ``pause()`` calls ``AsyncLLM.pause_generation(mode="keep", clear_cache=True)``: in-flight
  requests are frozen inside vLLM with their tokens, and the KV/prefix cache is dropped, so nothing computed
  under the old weights survives the sync. The unfinished trajectories are handed back (the scheduler owns and
  checkpoints them). ``resume()`` lets vLLM continue the frozen requests it still holds unchanged
  (``resume_generation``); a trajectory vLLM no longer holds (restored from a checkpoint, or restarted) is
  resubmitted with prompt + kept tokens as its prompt and the remaining token budget, as AReaL and xtuner do.
- **weights**: ``update_weights(state, version)`` runs ``start_weight_update`` → a weight sender (default: CUDA
  IPC handles of the state dict's tensors, vLLM's ``ipc`` weight-transfer backend) → ``finish_weight_update(
  weight_version=str(version))``.
- **per-token versions**: vLLM stamps output tokens with ``CompletionOutput.weight_versions``
  (``WeightVersionSpan(version, start, end)``, half-open over output positions); they become
  ``Trajectory.versions``. A vLLM without them is refused: versions must come from the engine, not a guess.
- **logprobs**: ``SamplingParams(logprobs=0)`` returns the sampled token's logprob; the engine must run with
  ``logprobs_mode="processed_logprobs"`` so it is the logprob of the tempered, top-p-truncated distribution the
  token was drawn from (checked at start-up).
- **R3**: with ``enable_return_routed_experts`` vLLM returns ``CompletionOutput.routed_experts``
  ``[positions, layers, top_k]`` starting at ``SamplingParams.routed_experts_prompt_start``; they extend
  ``Trajectory.routed_experts`` (one row per fed position), which ``posttrain.objectives.r3`` replays in the learner.
- **images**: a request's decoded images (``Request.images``) go in ``multi_modal_data``, one placeholder per image
  (``vllm_prompt``); the trajectory keeps the expanded prompt; the placeholder is never sampled (``logit_bias``).
  ``register_vllm_plugins`` adds the VLM projector's activation to vLLM's registry.

The request/response mapping is pure functions (``vllm_sampling_kwargs``, ``vllm_prompt``,
``expand_weight_versions``, ``apply_completion``), unit-tested in ``tests/posttrain/test_vllm_mapping.py`` with
stand-in objects shaped like vLLM's ``CompletionOutput``/``Logprob``/``WeightVersionSpan``; ``VLLMEngine``'s own
bookkeeping (keep-mode pause, continue in place vs resubmit, abort, version stamping) runs under the real scheduler
against a stand-in ``AsyncLLM`` in ``tests/posttrain/test_vllm_engine.py`` (through the ``VLLMApi`` seam). NOT
exercised here (no GPU, no vLLM): real vLLM, its KV-cache clearing on pause, the IPC weight sender, and the
coordinates of vLLM's ``routed_experts`` rows (vLLM documents that ``routed_experts_prompt_start`` skips that many
prompt positions; one row per position fed is assumed, and rows beyond the fed positions are dropped).

    engine = VLLMEngine(VLLMConfig(model="Qwen/Qwen3-30B-A3B", capacity=256, return_routed_experts=True))
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.rollout.engine import StepOutput
from posttrain.rollout.types import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, Request, SamplingParams, Trajectory

_FINISH = {"stop": FINISH_STOP, "length": FINISH_LENGTH}
"""vLLM finish_reason → ours; "abort" (our own pause/abort) leaves the trajectory unfinished."""


# -- pure mapping: our request → vLLM ---------------------------------------------------------------------------


def resubmission_seed(seed: int, attempt: int, n_kept: int) -> int:
    """vLLM seeds a request's RNG once; a resubmitted continuation must not replay the draws of position 0."""
    return (seed * 1_000_003 + attempt * 7_919 + n_kept * 104_729) % (2**31 - 1)


def vllm_sampling_kwargs(
    params: SamplingParams, n_kept: int = 0, attempt: int = 0, routes_from: int = 0, never: Sequence[int] = ()
) -> dict:
    """Keyword arguments for ``vllm.SamplingParams`` continuing a trajectory that already holds ``n_kept`` tokens.

    ``routes_from``: first position whose routed experts vLLM should return (positions already recorded are
    not asked for again). ``never``: token ids never to sample (a VLM's image placeholder, which the HF engine and
    the learner put at -inf: ``sampling.without_placeholder``), as a ``logit_bias`` of -100 (vLLM's OpenAI-style
    bias range): vLLM applies it before the processed logprobs, so a token's logprob differs from the learner's
    -inf mask by at most the placeholder's mass scaled by e^(-100/T), and it is never drawn.
    """
    remaining = params.target_length - n_kept
    if remaining <= 0:
        raise ValueError(f"nothing left to generate ({n_kept} of {params.target_length} tokens)")
    forced = params.forced_length is not None
    ignore_eos = params.ignore_eos or forced
    kw: dict[str, Any] = {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": remaining,
        "seed": resubmission_seed(params.seed, attempt, n_kept),
        "logprobs": 0,  # the sampled token's own logprob only
        "ignore_eos": ignore_eos,
        "stop_token_ids": [] if ignore_eos else list(params.stop_token_ids),
        "detokenize": False,  # tokens in, tokens out
    }
    if forced:
        kw["min_tokens"] = remaining
    if params.return_routed_experts:
        kw["routed_experts_prompt_start"] = routes_from
    if never:
        kw["logit_bias"] = {int(t): -100.0 for t in never}
    return kw


def vllm_prompt(traj: Trajectory, image: tuple[int, int] | None = None) -> dict:
    """The prompt vLLM sees: the original prompt plus every token already kept (a resubmitted continuation).

    A prompt with images (``Request.images``): vLLM expands each image placeholder of a token prompt itself, so each
    run of N placeholder ids (as the HF processor expanded them; ``image`` = (placeholder id, N) of the served model)
    becomes one placeholder, and the images go in ``multi_modal_data``; vLLM's LLaVA processor expands it back to the
    same N (square resize to the tower's size: N = (size / patch)², CLS dropped)."""
    ids = list(traj.prompt_ids) + list(traj.token_ids)
    images = traj.request.images
    if not images:
        if traj.request.pixel_values is not None:
            raise ValueError(f"{traj.request_id}: pixel values without decoded images (vLLM processes images itself)")
        if image is not None and image[0] in ids:  # e.g. restored from a checkpoint, which keeps no images
            raise ValueError(f"{traj.request_id}: image placeholders in the prompt and no images")
        return {"prompt_token_ids": ids}
    if image is None:
        raise ValueError(f"{traj.request_id} holds images and the served model is not a vision-language model")
    token, n = image
    out: list[int] = []
    run = 0
    for t in [*ids, None]:
        if t == token:
            run += 1
            continue
        if run % n:
            raise ValueError(f"{traj.request_id}: a run of {run} image placeholders is not a multiple of {n}")
        out += [token] * (run // n)
        run = 0
        if t is not None:
            out.append(t)
    if out.count(token) != len(images):
        raise ValueError(f"{traj.request_id}: {out.count(token)} image placeholders for {len(images)} images")
    return {"prompt_token_ids": out, "multi_modal_data": {"image": list(images)}}


def image_placeholder(model_config: Any) -> tuple[int, int] | None:
    """(placeholder id, ids per image) of a served LLaVA-style model (vLLM's ``ModelConfig.hf_config``), else None."""
    hf = getattr(model_config, "hf_config", None)
    if hf is None or not hasattr(hf, "vision_config"):
        return None
    return int(hf.image_token_index), int(hf.image_seq_length)


def register_vllm_plugins() -> None:
    """vLLM general plugin (entry point ``vllm.general_plugins`` in pyproject.toml; vLLM runs it in every process it
    starts): the identity activation ``linear`` the VLM export's projector names (``pretrain export --vlm``: W_in, an
    identity activation, an identity second layer). transformers' ``ACT2FN`` has it; vLLM's registry does not, and
    would refuse to build the projector."""
    from torch import nn
    from vllm.model_executor.layers import activation

    if "linear" not in activation._ACTIVATION_REGISTRY:
        activation._ACTIVATION_REGISTRY["linear"] = lambda: nn.Identity()  # a LazyDict of factories


# -- pure mapping: vLLM output → our trajectory ------------------------------------------------------------------


def expand_weight_versions(spans: Sequence[Any] | None, n_tokens: int) -> list[int]:
    """Per-token versions from ``WeightVersionSpan(version, start, end)`` spans covering output ``[0, n_tokens)``."""
    if spans is None:
        raise ValueError("vLLM returned no weight_versions: this vLLM cannot stamp tokens with policy versions")
    out: list[int] = []
    for span in spans:
        if span.start != len(out) or not span.start < span.end:
            raise ValueError(f"weight-version spans are not contiguous: {list(spans)}")
        out += [int(span.version)] * (span.end - span.start)
    if len(out) < n_tokens:
        raise ValueError(f"weight-version spans cover {len(out)} of {n_tokens} output tokens")
    return out[:n_tokens]


@dataclass
class Launch:
    """One vLLM request carrying (part of) a trajectory."""

    vllm_id: str
    traj: Trajectory
    base: int
    """Tokens the trajectory held when this request was submitted (its output starts after them)."""
    routes_from: int
    """Position of the first routed-experts row vLLM returns for this request."""


def apply_completion(launch: Launch, completion: Any) -> int:
    """Fold a CUMULATIVE ``CompletionOutput`` of ``launch`` into its trajectory; returns how many tokens were new.

    Tokens already applied are skipped (outputs repeat the whole response so far); per-token logprobs and
    versions come from the output; routed-experts rows extend ``traj.routed_experts`` up to the positions fed.
    """
    traj = launch.traj
    token_ids = list(completion.token_ids)
    done = traj.n_tokens - launch.base
    if done < 0 or done > len(token_ids):
        raise ValueError(f"{traj.request_id}: output has {len(token_ids)} tokens, trajectory already {done}")
    new = token_ids[done:]
    if new:
        if completion.logprobs is None or len(completion.logprobs) < len(token_ids):
            raise ValueError(f"{traj.request_id}: vLLM returned no sampled-token logprobs (logprobs=0 not honoured)")
        versions = expand_weight_versions(getattr(completion, "weight_versions", None), len(token_ids))
        for i, tok in enumerate(new, start=done):  # logprobs[i]: {token_id: Logprob(logprob, rank, decoded_token)}
            lp = completion.logprobs[i][tok]  # the sampled token is always in it
            traj.append(tok, float(getattr(lp, "logprob", lp)), versions[i])
    routes = getattr(completion, "routed_experts", None)
    if traj.routed_experts is not None and routes is not None:
        fed = len(traj.prompt_ids) + traj.n_tokens - 1  # the last sampled token is not fed yet
        have = len(traj.routed_experts)
        rows = routes[max(have - launch.routes_from, 0) : max(fed - launch.routes_from, 0)]
        traj.routed_experts.extend([[list(map(int, k)) for k in layer] for layer in (r.tolist() for r in rows)])
    reason = completion.finish_reason
    if reason is not None and reason in _FINISH:
        traj.finish_reason = _FINISH[reason]
    elif reason not in (None, "abort"):
        raise ValueError(f"{traj.request_id}: unknown vLLM finish_reason {reason!r}")
    return len(new)


# -- the engine -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMConfig:
    """How the vLLM engine is built."""

    model: str
    """Hugging Face name or local path of the policy."""
    capacity: int = 256
    """``max_num_seqs``: requests decoded concurrently."""
    version: int = 0
    """Policy version of the weights loaded at start."""
    return_routed_experts: bool = False
    """Ask vLLM for routed experts (R3; MoE policies only)."""
    weight_transfer_backend: str = "ipc"
    """vLLM weight-transfer backend the default sender speaks (CUDA IPC: trainer and engine on the same GPUs)."""
    poll_timeout_s: float = 30.0
    """How long ``step`` waits for an output before reporting an empty step."""
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``AsyncEngineArgs`` fields (tensor_parallel_size, gpu_memory_utilization, dtype, ...)."""
    draft_model: str | None = None
    """Hugging Face name or local path of the speculative draft (None: no speculative decoding)."""
    speculative_k: int = 4
    """Draft tokens per verification round (``SpeculativeConfig.k``)."""


def vllm_speculative_config(draft_model: str | None, k: int) -> dict | None:
    """vLLM's ``speculative_config`` for a separate draft model proposing ``k`` tokens (None when no draft).

    vLLM verifies with the same lossless rejection sampling as ``speculative.verify``."""
    if draft_model is None:
        return None
    if k < 1:
        raise ValueError("speculative k must be ≥ 1")
    return {"method": "draft_model", "model": draft_model, "num_speculative_tokens": int(k)}


WeightSender = Callable[[Any, Mapping[str, Any]], Any]
"""``async (async_llm, state) -> None``: moves a state dict into the engine between start/finish_weight_update."""


async def ipc_weight_sender(llm: Any, state: Mapping[str, Any]) -> None:
    """vLLM's ``ipc`` backend: CUDA IPC handles of the (GPU) tensors, keyed by the physical GPU's UUID."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    names, dtypes, shapes, handles, keep = [], [], [], [], []
    for name, tensor in state.items():
        t = tensor.detach().contiguous()
        keep.append(t)  # the handles point into these: they must outlive the transfer
        names.append(name)
        dtypes.append(str(t.dtype).split(".")[-1])
        shapes.append(list(t.shape))
        handles.append({uuid: reduce_tensor(t)})
    info = {"names": names, "dtype_names": dtypes, "shapes": shapes, "ipc_handles": handles}
    await llm.update_weights(WeightTransferUpdateRequest(update_info=info))
    del keep


@dataclass(frozen=True)
class VLLMApi:
    """The few vLLM entry points the engine uses; ``real_vllm_api()`` binds them to the installed vLLM.

    The seam exists so the engine's bookkeeping (pause/keep/resubmit/abort, version stamping) can be driven by a
    stand-in in tests; production always uses ``real_vllm_api()``.
    """

    start_llm: Callable[[VLLMConfig], Any]
    """``async (config) -> AsyncLLM``, called on the engine's event-loop thread."""
    sampling_params: Callable[..., Any]
    """``vllm.SamplingParams``."""
    output_kind: Any
    """``RequestOutputKind.CUMULATIVE``: every output repeats the response so far."""
    init_weight_transfer: Callable[[Any], Any] | None = None
    """``async (llm) -> None``: once, before the first weight update."""


def real_vllm_api(config: VLLMConfig) -> VLLMApi:
    try:
        import vllm
    except ImportError as e:  # a clear error, never a silent fallback to another engine
        raise ImportError("VLLMEngine needs vLLM on a GPU machine: pip install vllm") from e
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    args = dict(config.engine_args)
    args.update(
        model=config.model,
        max_num_seqs=config.capacity,
        logprobs_mode="processed_logprobs",
        enable_return_routed_experts=config.return_routed_experts,
    )
    spec = vllm_speculative_config(config.draft_model, config.speculative_k)
    if spec is not None:
        args["speculative_config"] = spec
    init = None
    if config.weight_transfer_backend:
        from vllm.config import WeightTransferConfig
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        args["weight_transfer_config"] = WeightTransferConfig(backend=config.weight_transfer_backend)

        async def init(llm):
            await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))

    async def start(_config):
        return AsyncLLM.from_engine_args(vllm.AsyncEngineArgs(**args))

    return VLLMApi(start, vllm.SamplingParams, RequestOutputKind.CUMULATIVE, init)


class VLLMEngine:
    """``RolloutEngine`` over vLLM's ``AsyncLLM``, run on a private event-loop thread (see the module docstring).

    ``step()`` is a poll: it waits for at least one new output, folds every output that arrived into its
    trajectory, and returns the finished ones. ``n_decoded`` counts requests that received tokens, ``new_tokens``
    holds their new ids (ids folded in by a ``pause`` are reported by the next ``step``).
    """

    def __init__(
        self, config: VLLMConfig, weight_sender: WeightSender = ipc_weight_sender, api: VLLMApi | None = None
    ) -> None:
        api = api or real_vllm_api(config)
        self.config = config
        self._api = api
        self._sender = weight_sender
        self._version = config.version
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        self._outputs: queue.Queue = queue.Queue()
        self._launches: dict[str, Launch] = {}  # running in vLLM
        self._parked: dict[str, tuple[Launch, int, int]] = {}  # request_id → (launch, n_tokens, attempt) at pause
        self._finished_late: list[Trajectory] = []  # finished while pausing; handed out by the next step()
        self._new_late: dict[str, list[int]] = {}  # ids folded in while pausing; reported by the next step()
        self._paused = False
        self._n_launched = 0
        self.resubmissions = 0
        """Continuations resubmitted with prompt + kept tokens (not continued inside vLLM)."""
        self._llm = self._run(api.start_llm(config))
        self._image = image_placeholder(self._llm.model_config)
        if self._llm.model_config.logprobs_mode != "processed_logprobs":
            raise RuntimeError("vLLM must return processed logprobs (the distribution tokens were drawn from)")
        if api.init_weight_transfer is not None:
            self._run(api.init_weight_transfer(self._llm))
        self._run(self._llm.update_weight_version(str(self._version)))

    # -- protocol properties -------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @property
    def n_active(self) -> int:
        return len(self._launches) + len(self._finished_late)

    # -- protocol methods ---------------------------------------------------------------------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        self._unpause(keep=())
        for r in requests:
            self._launch(Trajectory(request=r, routed_experts=[] if r.params.return_routed_experts else None))

    def resume(self, trajectories: Sequence[Trajectory]) -> None:
        keep = []
        for t in trajectories:
            if t.finished:
                raise ValueError(f"{t.request_id} is finished; only paused trajectories resume")
            parked = self._parked.get(t.request_id)
            if parked is not None and (parked[1], parked[2]) == (t.n_tokens, t.attempt):
                launch = parked[0]
                launch.traj = t  # the caller's object (it may have been restored from a checkpoint)
                keep.append(launch)
        self._unpause(keep=keep)
        kept = {launch.traj.request_id for launch in keep}
        for t in trajectories:
            if t.request_id not in kept:
                self._launch(t)

    def pause(self) -> list[Trajectory]:
        self._run(self._llm.pause_generation(mode="keep", clear_cache=True))
        self._drain(block=False, finished=self._finished_late, new_tokens=self._new_late)
        self._paused = True
        for launch in self._launches.values():
            self._parked[launch.traj.request_id] = (launch, launch.traj.n_tokens, launch.traj.attempt)
        out = [launch.traj for launch in self._launches.values()]
        self._launches = {}
        # Outputs still in flight from before the freeze are ignored (their request is parked); a kept request's
        # next CUMULATIVE output repeats them, with the versions vLLM stamped when they were sampled.
        return out

    def abort(self, request_ids: Sequence[str]) -> list[Trajectory]:
        ids = set(request_ids)
        hit = [launch for launch in self._launches.values() if launch.traj.request_id in ids]
        if hit:
            self._run(self._llm.abort([launch.vllm_id for launch in hit]))
        for launch in hit:
            self._launches.pop(launch.vllm_id, None)
            launch.traj.finish_reason = FINISH_ABORT
        return [launch.traj for launch in hit]

    def update_weights(self, state: Mapping[str, Any], version: int) -> None:
        if self._launches:
            raise RuntimeError("update_weights while requests are running: pause() first")

        async def update():
            await self._llm.start_weight_update()
            if state:
                await self._sender(self._llm, state)
            await self._llm.finish_weight_update(weight_version=str(int(version)))

        self._run(update())
        self._version = int(version)

    def step(self) -> StepOutput:
        out = StepOutput(finished=self._finished_late, new_tokens=self._new_late)
        self._finished_late, self._new_late = [], {}
        advanced = self._drain(block=True, finished=out.finished, new_tokens=out.new_tokens)
        out.n_decoded = len(advanced)
        return out

    def close(self) -> None:
        self._llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # -- internals ----------------------------------------------------------------------------------------------
    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _unpause(self, keep: Sequence[Launch]) -> None:
        """Leave the paused state: parked requests in ``keep`` continue inside vLLM, the others are aborted."""
        if not self._paused:
            return
        keep_ids = {launch.vllm_id for launch in keep}
        drop = [launch.vllm_id for launch, _, _ in self._parked.values() if launch.vllm_id not in keep_ids]
        if drop:
            self._run(self._llm.abort(drop))
        for launch in keep:
            self._launches[launch.vllm_id] = launch
        self._parked.clear()
        self._run(self._llm.resume_generation())
        self._paused = False

    def _launch(self, traj: Trajectory) -> None:
        self._n_launched += 1
        p = traj.request.params
        routes_from = len(traj.routed_experts) if traj.routed_experts is not None else 0
        never = (self._image[0],) if self._image is not None else ()  # the image placeholder is never sampled
        kw = vllm_sampling_kwargs(p, traj.n_tokens, traj.attempt, routes_from, never)
        params = self._api.sampling_params(**kw, output_kind=self._api.output_kind)
        if traj.n_tokens:
            self.resubmissions += 1
        launch = Launch(f"{traj.request_id}@{traj.attempt}.{self._n_launched}", traj, traj.n_tokens, routes_from)
        self._launches[launch.vllm_id] = launch
        prompt = vllm_prompt(traj, self._image)

        async def consume():
            try:
                async for output in self._llm.generate(prompt, params, request_id=launch.vllm_id):
                    self._outputs.put(("output", launch.vllm_id, output.outputs[0]))
            except Exception as e:  # surfaced by the next step(), never swallowed
                self._outputs.put(("error", launch.vllm_id, e))

        asyncio.run_coroutine_threadsafe(consume(), self._loop)

    def _drain(self, block: bool, finished: list[Trajectory], new_tokens: dict[str, list[int]]) -> set[str]:
        advanced: set[str] = set()
        timeout = self.config.poll_timeout_s if block and self._launches else None
        while True:
            try:
                item = self._outputs.get(timeout=timeout) if timeout else self._outputs.get_nowait()
            except queue.Empty:
                return advanced
            timeout = None  # after the first item, take only what is already there
            kind, vid, payload = item
            if kind == "error":
                raise RuntimeError(f"vLLM request {vid} failed") from payload
            launch = self._launches.get(vid)
            if launch is None:  # an aborted or parked request's late output
                continue
            n_new = apply_completion(launch, payload)
            if n_new:
                advanced.add(vid)
                new_tokens.setdefault(launch.traj.request_id, []).extend(launch.traj.token_ids[-n_new:])
            if launch.traj.finished:
                del self._launches[vid]
                finished.append(launch.traj)
