"""What flows between the rollout engine, the scheduler and the learner (SPEC §C1–C3).

A ``Request`` asks for one sampled response to a prompt. The engine turns it into a ``Trajectory``
that grows one token per engine step and records, for every generated token, the token id, its
logprob under the sampling distribution actually used (temperature, top-p), the policy version that
produced it and (MoE policies) the experts the router chose. With partial rollout a trajectory can be
paused, carried across weight syncs and resumed, so one response can hold tokens of several versions;
the learner weights each token against its own behaviour logprob (Eq 10).

Plain mutable dataclasses: the scheduler checkpoints in-flight trajectories with ``to_dict`` and
restores them with ``from_dict`` (JSON-safe: ints, floats, strings, lists, dicts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

FINISH_STOP = "stop"
"""Finished on a stop/EOS token (the token is part of ``token_ids``)."""
FINISH_LENGTH = "length"
"""Hit ``max_new_tokens`` (or the forced length)."""
FINISH_ABORT = "abort"
"""Aborted by the caller; tokens so far are kept but the trajectory is not trained on by default."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled."""

    max_new_tokens: int = 64
    """Upper bound on generated tokens (the stop token counts)."""
    temperature: float = 1.0
    """Logits are divided by this before softmax; logprobs are of the tempered distribution (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass ≥ top_p, renormalised."""
    seed: int = 0
    """Per-request seed; token t is drawn with a generator seeded from (seed, t), so a pause/resume
    (or a crash and restart) never changes which random numbers a position uses."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end the response (EOS); ignored when ``ignore_eos``."""
    ignore_eos: bool = False
    """Never stop on a stop token (benchmarks force lengths)."""
    forced_length: int | None = None
    """Generate exactly this many tokens (implies ``ignore_eos``); for long-tailed length benchmarks."""
    return_routed_experts: bool = False
    """Record the MoE router's expert choices per position (R3)."""

    @property
    def target_length(self) -> int:
        """Most tokens this request may produce."""
        return self.max_new_tokens if self.forced_length is None else self.forced_length

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingParams:
        d = dict(d)
        d["stop_token_ids"] = tuple(d.get("stop_token_ids", ()))
        return cls(**d)


@dataclass
class Request:
    """One response to sample. ``request_id`` is unique for the whole run (checkpoints key on it)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    group_id: str = ""
    """Responses to the same prompt share a group (LOO baseline, DAPO filter)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Task data the verifier needs (e.g. the reference answer); opaque to engines."""
    pixel_values: Any = field(default=None, compare=False, repr=False)
    """A vision-language prompt's images (its processor's ``pixel_values``), fed at prefill only; not serialised."""
    images: tuple = field(default=(), compare=False, repr=False)
    """The same images decoded (RGB ``PIL.Image``), for an engine that runs its own processor (vLLM); not
    serialised."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "prompt_ids": list(self.prompt_ids),
            "params": self.params.to_dict(),
            "group_id": self.group_id,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Request:
        return cls(
            request_id=d["request_id"],
            prompt_ids=list(d["prompt_ids"]),
            params=SamplingParams.from_dict(d["params"]),
            group_id=d.get("group_id", ""),
            meta=dict(d.get("meta", {})),
        )


@dataclass
class Trajectory:
    """A (possibly partial) response: per generated token its id, behaviour logprob, version and loss mask.

    Invariants (checked by ``validate``): ``token_ids``, ``logprobs``, ``versions``, ``loss_mask`` have
    one entry per generated token; ``versions`` never decreases; ``routed_experts``, when recorded, has
    one entry per position *fed to the model* so far (prompt positions then generated tokens; the last
    sampled token is fed only if decoding continues), each ``[n_layers][top_k]`` expert ids.
    """

    request: Request
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """log π_beh(y_t | prefix) of the distribution the token was drawn from (after temperature/top-p)."""
    versions: list[int] = field(default_factory=list)
    """Policy version of the engine weights that produced each token."""
    loss_mask: list[int] = field(default_factory=list)
    """1 = trained on; 0 = context only (tool output, forced text)."""
    routed_experts: list[list[list[int]]] | None = None
    finish_reason: str | None = None
    """None while in flight; FINISH_STOP / FINISH_LENGTH / FINISH_ABORT once done."""
    reward: float | None = None
    """Set by the scheduler's verifier once finished."""
    attempt: int = 0
    """How many times this request was restarted from scratch (stale discard)."""
    rescored_logprobs: list[float] = field(default_factory=list)
    """The engine's logprobs of the first ``len(rescored_logprobs)`` tokens recomputed when it last re-prefilled
    them (a resume after a weight sync), under the weights of ``rescored_version``. With the logprobs of tokens
    sampled at a version, these give the engine's view at the *learner's* version of every token the engine saw
    at that version: the BKL mask compares trainer and engine at the same weights (SPEC C3), not across versions."""
    rescored_version: int = -1
    """Version of the weights behind ``rescored_logprobs`` (-1: never re-prefilled)."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def group_id(self) -> str:
        return self.request.group_id

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        """Tokens it may still generate."""
        return self.request.params.target_length - len(self.token_ids)

    def append(self, token_id: int, logprob: float, version: int, trained: bool = True) -> None:
        """Add one generated token; versions must not go backwards."""
        if self.versions and version < self.versions[-1]:
            raise ValueError(f"{self.request_id}: version {version} after {self.versions[-1]}")
        self.token_ids.append(int(token_id))
        self.logprobs.append(float(logprob))
        self.versions.append(int(version))
        self.loss_mask.append(1 if trained else 0)

    def rescore(self, logprobs: list[float], version: int) -> None:
        """Record the engine's logprobs of the kept tokens recomputed at ``version`` (a re-prefill)."""
        if len(logprobs) != self.n_tokens:
            raise ValueError(f"{self.request_id}: {len(logprobs)} rescored logprobs for {self.n_tokens} tokens")
        self.rescored_logprobs, self.rescored_version = [float(x) for x in logprobs], int(version)

    def engine_logprobs_at(self, version: int) -> list[float | None]:
        """Per token, the engine's logprob under the weights of ``version``, or None where it has none: a token
        sampled at ``version`` has its behaviour logprob; an older one its re-prefilled logprob when the last
        re-prefill was at ``version``."""
        rescored = self.rescored_logprobs if self.rescored_version == version else []
        return [
            lp if v == version else (rescored[i] if i < len(rescored) else None)
            for i, (lp, v) in enumerate(zip(self.logprobs, self.versions))
        ]

    def validate(self) -> None:
        n = len(self.token_ids)
        if not (len(self.logprobs) == len(self.versions) == len(self.loss_mask) == n):
            raise ValueError(f"{self.request_id}: per-token fields disagree in length")
        if any(b < a for a, b in zip(self.versions, self.versions[1:])):
            raise ValueError(f"{self.request_id}: versions decrease")

    def restart(self) -> None:
        """Drop every generated token (stale discard); the request is sampled again with a new seed."""
        self.token_ids, self.logprobs, self.versions, self.loss_mask = [], [], [], []
        self.routed_experts = [] if self.routed_experts is not None else None
        self.finish_reason = None
        self.reward = None
        self.rescored_logprobs, self.rescored_version = [], -1
        self.attempt += 1

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "request"}
        d = {k: (list(v) if isinstance(v, list) else v) for k, v in d.items()}
        d["request"] = self.request.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        req = Request.from_dict(d.pop("request"))
        return cls(request=req, **d)
