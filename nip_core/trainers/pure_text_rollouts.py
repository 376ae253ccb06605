"""Rollout sampling for the pure-text trainers: datapoint order, episode seeds, acting.

Seeds come from sha256 (never Python's salted ``hash``, docs/behaviour.md#b22). Iteration ``i`` takes
items ``[i*N, (i+1)*N)`` of an endless sequence of per-epoch permutations of the dataset,
so any iteration maps to datapoints directly and sampling can never hang (docs/behaviour.md#b31).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from nip_core.environments.nested_array_dict import NestedArrayDict
from nip_core.scenarios.code_validation.text_protocols import (
    History,
    InvalidResponseError,
    build_chat_messages,
    parse_reply,
    question_form,
    verifier_last_active_round,
)

log = logging.getLogger(__name__)


def stable_seed(*parts: Any, modulus: int = 2**63) -> int:
    """A seed from the sha256 of ``parts`` (reproducible across processes)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") % modulus


def datapoint_indices(seed: int, dataset_size: int, start: int, count: int) -> list[int]:
    """Indices ``start .. start+count`` of the endless sequence of seeded per-epoch permutations."""
    if dataset_size <= 0:
        raise ValueError("cannot sample rollouts from an empty dataset")
    out, cache = [], {}
    for k in range(start, start + count):
        epoch, pos = divmod(k, dataset_size)
        if epoch not in cache:
            cache[epoch] = np.random.default_rng(stable_seed(seed, "epoch", epoch)).permutation(dataset_size)
        out.append(int(cache[epoch][pos]))
    return out


def history_of(state: NestedArrayDict, prefix: str = "") -> History:
    """The prompt-building view of an episode state (``prefix="next."`` for a timestep's outcome)."""
    return History(message_history=state[prefix + "message_history"],
                   message_agent_id=state[prefix + "message_agent_id"],
                   raw_message_history=state[prefix + "raw_message_history"],
                   seed=int(state["seed"]), question=str(state["question"][()] if state["question"].shape == () else state["question"]),
                   solution=str(state["solution"][()] if state["solution"].shape == () else state["solution"]),
                   prover_stance=int(state["prover_stance"]))


class TextActor:
    """Produces the actions of all agents for an episode state (one API call per active agent)."""

    def __init__(self, env: Any, agents: dict[str, Any], protocol: str, hyper_params: Any):
        self.env = env
        self.agents = agents
        self.protocol = protocol
        self.hp = hyper_params
        self.handler = env.protocol_handler
        self.tokens = 0
        self._lock = threading.Lock()

    def __call__(self, state: NestedArrayDict) -> dict[str, np.ndarray]:
        names, channels = self.env.agent_names, self.env.channel_names
        a, c = len(names), len(channels)
        message = np.empty((a, c), dtype=object)
        message.fill(None)
        raw = np.empty(a, dtype=object)
        raw.fill(None)
        decision = np.full(a, 2, dtype=np.int64)
        retry = np.zeros((a, c), dtype=np.int64)
        token_limit = np.zeros((a, c), dtype=bool)
        active = self.env.active_mask(state)
        rnd = int(state["round"])
        hist = history_of(state)
        for i, agent in enumerate(names):
            active_channels = [channels[j] for j in range(c) if active[i, j]]
            if not active_channels:
                continue
            params = self.hp.agent_params(agent)
            prompt = build_chat_messages(self.handler, self.protocol, agent, hist,
                                         max_response_words=params.max_response_words, until_round=rnd)
            is_verifier = "verifier" in agent
            last = verifier_last_active_round(self.handler, agent, hist.seed) if is_verifier else -1
            counts = rnd >= self.handler.min_message_rounds - 1  # an earlier decision is ignored
            form = (question_form(self.handler, agent, active_channels, params.max_response_words,
                                  decision_counts=counts)
                    if is_verifier and rnd != last else None)
            parsed, text, tries = None, None, 0
            while parsed is None and tries <= params.num_invalid_generation_retries:
                seed = stable_seed(hist.seed, int(state["datapoint_id"]), rnd, agent, tries, modulus=2**31)
                text, finish, tokens = self.agents[agent].generate(prompt, seed=seed,
                                                                   decision=is_verifier and rnd == last, form=form)
                with self._lock:
                    self.tokens += tokens
                if finish == "length":
                    token_limit[i, [channels.index(ch) for ch in active_channels]] = True
                try:
                    parsed = parse_reply(self.handler, agent, text, active_channels,
                                         may_decide=is_verifier, must_decide=is_verifier and rnd == last)
                except InvalidResponseError as e:
                    tries += 1
                    log.debug("agent %s round %d: invalid reply (%s)", agent, rnd, e)
            for ch in active_channels:
                retry[i, channels.index(ch)] = tries
            if parsed is None:
                # Fixed (docs/behaviour.md#b32): after too many invalid replies the agent sends nothing at all.
                log.warning("agent %s round %d: gave up after %d invalid replies", agent, rnd, tries)
                continue
            raw[i] = text
            decision[i] = parsed.decision
            for ch, msg in parsed.messages.items():
                if msg is not None:
                    message[i, channels.index(ch)] = msg
        return {"message": message, "raw_message": raw, "decision": decision,
                "retry_count": retry, "token_limit": token_limit}


def run_episodes(env: Any, actor: TextActor, dataset: Any, indices: list[int], seeds: list[int],
                    max_workers: int, on_done: Callable[[], None] | None = None) -> list[NestedArrayDict]:
    """One padded rollout per ``(dataset[index], seed)``, in order, ``max_workers`` at a time."""

    def one(k: int) -> NestedArrayDict:
        dp = dataset[indices[k]]
        rollout = env.run_episode(env.reset(dp, seeds[k], datapoint_id=indices[k]), actor)
        if on_done is not None:
            on_done()
        return rollout

    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        return list(pool.map(one, range(len(indices))))
