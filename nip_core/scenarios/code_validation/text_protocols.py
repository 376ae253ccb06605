"""Prompts and reply parsing of the code-validation protocols.

System prompts live in ``prompts/<protocol>_<role>.txt`` (``string.Template``; role is
``verifier`` or ``prover``). They state the reply format that the parsers below read, for any
chat model: a verifier prompt shows ``Question for <Name>:`` headers (one per visible
channel) and the two ``Decision:`` lines; a prover prompt shows ``Answer:`` and the stance
sentence "convince the Verifier to accept|reject". The local stand-in's selection engine
reads the same lines to choose its kind of reply (``nipflow_llm_server/policy/formats.py``);
the prompts do not depend on it.

Chat prompt (docs/behaviour.md#b33): the system prompt, then per round the agent's own raw reply
as ``assistant`` and the other agents' messages on its visible channels as ``user``
(with the sender's name), channels in an order shuffled per round with seed
``env seed + round`` for protocols that randomise it; the history stops at the first
round with nothing to show. The last-round system message ("You cannot ask any more
questions. You must now make a decision.") is inserted before the verifier's *last
active* round (the original inserted it before round ``max_rounds - 1``, where under
``verifier_first`` the verifier is not active and never saw it).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

PROMPTS_DIR = Path(__file__).parent / "prompts"
DECISION_RE = re.compile(r"^\s*decision\s*:\s*(accept|reject)\b", re.IGNORECASE)
SHUFFLED_CHANNEL_PROTOCOLS = frozenset({"debate", "mnip"})


class InvalidResponseError(ValueError):
    """A reply that does not follow the format the agent was asked for."""


class UnknownPromptError(KeyError):
    """No prompt template for a (protocol, role)."""


def human_name(agent_name: str) -> str:
    """Display name used in prompts and message ``name`` fields (``prover0`` -> ``Expert0``)."""
    if agent_name.startswith("prover"):
        return "Expert" + agent_name[len("prover"):]
    return agent_name.capitalize()


def role_of(agent_name: str) -> str:
    return "verifier" if "verifier" in agent_name else "prover"


@lru_cache(maxsize=None)
def load_template(protocol: str, role: str) -> string.Template:
    """The ``string.Template`` for ``(protocol, role)``.

    Raises
    ------
    UnknownPromptError
        If ``prompts/<protocol>_<role>.txt`` does not exist.
    """
    path = PROMPTS_DIR / f"{protocol}_{role}.txt"
    if not path.exists():
        raise UnknownPromptError(f"no prompt template {path.name} for protocol '{protocol}', role '{role}'")
    return string.Template(path.read_text())


def last_round_message() -> str:
    return (PROMPTS_DIR / "last_round.txt").read_text().strip()


def channel_sender(handler: Any, channel: str, receiver: str) -> str | None:
    """The agent (other than ``receiver``) whose messages a channel carries for ``receiver``."""
    others = [a for a in handler.agent_names if a != receiver and handler.can_agent_see_channel(a, channel)]
    if channel.endswith("_channel") and channel[: -len("_channel")] in others:
        return channel[: -len("_channel")]
    provers = [a for a in others if "prover" in a]
    return provers[0] if provers else (others[0] if others else None)


def question_headers(handler: Any, agent: str) -> list[tuple[str, str]]:
    """``(channel, "Question for <Name>:")`` for each channel the verifier asks on."""
    out = []
    for ch in handler.agent_visible_channels(agent):
        sender = channel_sender(handler, ch, agent)
        if sender is not None:
            out.append((ch, f"Question for {human_name(sender)}:"))
    return out


def stance_word(handler: Any, agent: str, prover_stance: int | None) -> str:
    return "accept" if handler.agent_stance(agent, prover_stance) == 1 else "reject"


def build_system_prompt(handler: Any, protocol: str, agent: str, question: str, solution: str,
                        prover_stance: int | None, max_response_words: int) -> str:
    """The rendered system prompt of ``agent``."""
    role = role_of(agent)
    fields = {"question": question.strip(), "solution": solution.rstrip(), "max_words": max_response_words,
              "human_name": human_name(agent), "max_questions": max(1, handler.max_verifier_questions)}
    if role == "verifier":
        fields["headers"] = "\n".join(h for _, h in question_headers(handler, agent))
    else:
        fields["stance"] = stance_word(handler, agent, prover_stance)
    return load_template(protocol, role).substitute(fields)


def verifier_last_active_round(handler: Any, agent: str, seed: int) -> int:
    """The last round in which the verifier may act (where it must decide)."""
    rounds = torch.arange(handler.max_message_rounds)
    mask = handler.get_active_agents_mask(rounds, torch.full_like(rounds, seed))
    active = mask[:, handler.agent_names.index(agent)].any(-1).nonzero().flatten().tolist()
    return active[-1] if active else -1


def channel_order(handler: Any, protocol: str, agent: str, seed: int, rnd: int) -> list[str]:
    channels = list(handler.agent_visible_channels(agent))
    if protocol in SHUFFLED_CHANNEL_PROTOCOLS and getattr(handler.protocol_params, "randomize_channel_order", False):
        perm = np.random.default_rng(int(seed) + rnd).permutation(len(channels))
        channels = [channels[i] for i in perm]
    return channels


@dataclass
class History:
    """The parts of an episode state a prompt is built from."""

    message_history: np.ndarray  # (rounds, channels) object
    message_agent_id: np.ndarray  # (rounds, channels) int
    raw_message_history: np.ndarray  # (rounds, agents) object
    seed: int
    question: str
    solution: str
    prover_stance: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def build_chat_messages(handler: Any, protocol: str, agent: str, history: History, *,
                        max_response_words: int, until_round: int | None = None) -> list[dict[str, str]]:
    """The chat prompt of ``agent`` from the history of rounds ``< until_round`` (all if None).

    The last-round system message is appended at the verifier's last active round.
    """
    names = list(handler.agent_names)
    a_idx = names.index(agent)
    channels = list(handler.message_channel_names)
    messages = [{"role": "system", "content": build_system_prompt(
        handler, protocol, agent, history.question, history.solution, history.prover_stance, max_response_words)}]
    last = verifier_last_active_round(handler, agent, history.seed) if role_of(agent) == "verifier" else -1
    max_r = history.message_history.shape[0] if until_round is None else until_round
    for r in range(handler.max_message_rounds):
        if r == last and r > 0:
            messages.append({"role": "system", "content": last_round_message()})
        if r >= max_r:
            break
        appended = False
        raw_self = history.raw_message_history[r, a_idx]
        if raw_self is not None:
            messages.append({"role": "assistant", "content": str(raw_self)})
            appended = True
        for ch in channel_order(handler, protocol, agent, history.seed, r):
            c = channels.index(ch)
            msg, sender = history.message_history[r, c], int(history.message_agent_id[r, c])
            if msg is None or sender < 0 or sender == a_idx:
                continue
            messages.append({"role": "user", "content": str(msg), "name": human_name(names[sender])})
            appended = True
        if not appended:
            break
    return messages


@dataclass
class ParsedReply:
    """A parsed reply: per-channel messages (None = not sent) and the decision (2 = continue)."""

    messages: dict[str, str | None]
    decision: int = 2


#: characters per word a question line may take (its length is bounded so that every line fits)
CHARS_PER_WORD = 8


def question_form(handler: Any, agent: str, active_channels: list[str], max_response_words: int, *,
                  decision_counts: bool = True) -> str | None:
    """The regular expression of a verifier's valid reply in a round where it may ask and decide:
    ``Decision: accept|reject``, or one ``Question for <Name>: ...`` line per active channel,
    each at most its share of ``max_response_words`` (:data:`CHARS_PER_WORD` characters a word)
    long (what :func:`parse_reply` accepts; None where a channel has no header to ask under).

    ``decision_counts=False`` (a round before ``min_message_rounds - 1``, where the protocol
    ignores a decision and the verifier would send nothing) leaves the decision out: only
    the questions."""
    headers = dict(question_headers(handler, agent))
    if not active_channels or any(ch not in headers for ch in active_channels):
        return None
    line = max(8, CHARS_PER_WORD * max_response_words // len(active_channels))
    questions = "\n".join(re.escape(headers[ch]) + f" [^\\s][^\\n]{{0,{line - 1}}}" for ch in active_channels)
    return f"Decision: (accept|reject)|{questions}" if decision_counts else questions


def parse_reply(handler: Any, agent: str, reply: str, active_channels: list[str], *,
                may_decide: bool, must_decide: bool) -> ParsedReply:
    """Parse ``reply`` of ``agent`` in a round where it is active on ``active_channels``.

    Raises
    ------
    InvalidResponseError
        Empty reply; a decision where none is allowed; no decision where one is required;
        a verifier question reply missing a channel's ``Question for <Name>:`` line.
    """
    text = (reply or "").strip()
    if not text:
        raise InvalidResponseError("empty reply")
    none = {ch: None for ch in handler.message_channel_names}
    if role_of(agent) == "verifier":
        m = DECISION_RE.match(text)
        if m:
            if not may_decide:
                raise InvalidResponseError("a decision was made where the verifier may not decide")
            return ParsedReply(none, 1 if m.group(1).lower() == "accept" else 0)
        if must_decide:
            raise InvalidResponseError("the verifier must reply 'Decision: accept' or 'Decision: reject'")
        headers = dict(question_headers(handler, agent))
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        out = dict(none)
        for ch in active_channels:
            header = headers.get(ch)
            if header is None:
                continue
            found = [ln[len(header):].strip() for ln in lines if ln.startswith(header)]
            if not found or not found[0]:
                raise InvalidResponseError(f"missing a '{header}' line")
            out[ch] = found[0]
        if len(active_channels) == 1 and out[active_channels[0]] is None:
            out[active_channels[0]] = text
        return ParsedReply(out)
    if DECISION_RE.match(text):
        raise InvalidResponseError("a prover may not make a decision")
    return ParsedReply({**none, **{ch: text for ch in active_channels}})
