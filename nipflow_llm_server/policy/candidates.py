"""Candidate responses: generated from the prompt's format, or learned in training.

Generated candidates come from small fixed banks of code-review questions, arguments
for and against a solution, and generic replies; some of them quote a line of the code
found in the prompt. Each candidate carries a *template* label (which bank entry it
came from) so that what the model learns about one template carries over to the same
template quoting other code.
"""

from __future__ import annotations

from dataclasses import dataclass

from nipflow_llm_server.policy.formats import (
    DECISION_ACCEPT,
    DECISION_REJECT,
    KIND_ANSWER,
    KIND_DECISION,
    KIND_GENERIC,
    KIND_QUESTION,
    ResponseFormat,
    classify_response,
)

MEMORY_TEMPLATE = "memory"


@dataclass(frozen=True)
class Candidate:
    """One possible response: its text, kind and template label."""

    text: str
    kind: str
    template: str


QUESTIONS = (
    "What does the code do when the input is as small as the constraints allow?",
    "Can you walk me through how the solution handles the edge cases of the problem?",
    "Is there an off-by-one error in any of the loop bounds?",
    "What is the time complexity, and does it fit within the constraints?",
    "How does the code handle repeated values in the input?",
    "Could overflow, rounding or integer division change the result anywhere?",
    "Does the output format match exactly what the problem asks for?",
    "Which input would make this solution fail, if any?",
)
QUOTED_QUESTIONS = (
    "Why is this line correct?\n```python\n{line}\n```",
    "What happens at this line when the input is at its largest or smallest?\n```python\n{line}\n```",
    "Can the condition in this line be wrong for boundary values?\n```python\n{line}\n```",
)
ARGUMENTS = {
    "accept": (
        "The solution is correct: it follows the problem statement step by step and handles every case it describes.",
        "I have checked the edge cases, including the smallest and largest inputs, and the code returns the right answer for each.",
        "The loop bounds and the conditions are exactly right, so there is no off-by-one error.",
        "The algorithm runs well within the time limits and its output format matches the specification.",
        "Every branch of the code corresponds to a case in the problem, so the solution should be accepted.",
    ),
    "reject": (
        "The solution is wrong: it misses a case that the problem statement explicitly allows.",
        "The code fails on boundary inputs, where its result differs from the expected answer.",
        "There is an off-by-one error in the loop bounds, so some inputs give a wrong result.",
        "One of the conditions is subtly wrong, so the solution should be rejected.",
        "The output is only correct for typical inputs; an edge case breaks it.",
    ),
}
QUOTED_ARGUMENTS = {
    "accept": (
        "This line does exactly what the problem requires:\n```python\n{line}\n```",
        "The key step is correct, as this line shows:\n```python\n{line}\n```",
    ),
    "reject": (
        "This line is where the bug is; it gives a wrong result on some inputs:\n```python\n{line}\n```",
        "The condition here is wrong for boundary values:\n```python\n{line}\n```",
    ),
}
GENERIC_REPLIES = (
    "Understood.",
    "Could you clarify what you mean?",
    "Thank you, that is helpful.",
    "I am not sure; let me think about it.",
    "Yes.",
    "No.",
)


def _question_bodies(fmt: ResponseFormat) -> list[tuple[str, str]]:
    bodies = [(f"question:{i}", text) for i, text in enumerate(QUESTIONS)]
    for i, template in enumerate(QUOTED_QUESTIONS):
        for line in fmt.code_lines:
            bodies.append((f"question:q{i}", template.format(line=line)))
    return bodies


def _questions(fmt: ResponseFormat) -> list[Candidate]:
    bodies = _question_bodies(fmt)
    headers = fmt.question_headers
    out = []
    for i, (template, body) in enumerate(bodies):
        if len(headers) == 1:
            out.append(Candidate(f"{headers[0]} {body}", KIND_QUESTION, template))
            continue
        # several headers: one question per header, a fixed rotation through the bank so
        # that the headers do not all ask the same question
        lines = []
        labels = []
        for j, header in enumerate(headers):
            label, text = bodies[(i + 3 * j) % len(bodies)]
            lines.append(f"{header} {text}")
            labels.append(label)
        out.append(Candidate("\n".join(lines), KIND_QUESTION, "+".join(labels)))
    return out


def _answers(fmt: ResponseFormat) -> list[Candidate]:
    stances = (fmt.stance,) if fmt.stance else ("accept", "reject")
    out = []
    for stance in stances:
        for i, text in enumerate(ARGUMENTS[stance]):
            out.append(Candidate(f"Answer: {text}", KIND_ANSWER, f"answer:{stance}:{i}"))
        for i, template in enumerate(QUOTED_ARGUMENTS[stance]):
            for line in fmt.code_lines:
                out.append(
                    Candidate(f"Answer: {template.format(line=line)}", KIND_ANSWER, f"answer:{stance}:q{i}")
                )
    return out


def generate_candidates(fmt: ResponseFormat) -> list[Candidate]:
    """The generated candidates for a prompt of format ``fmt``."""
    kinds = fmt.kinds
    out: list[Candidate] = []
    if not fmt.marked:
        return [Candidate(text, KIND_GENERIC, f"generic:{i}") for i, text in enumerate(GENERIC_REPLIES)]
    if KIND_DECISION in kinds:
        out.append(Candidate(DECISION_ACCEPT, KIND_DECISION, "decision:accept"))
        out.append(Candidate(DECISION_REJECT, KIND_DECISION, "decision:reject"))
    if KIND_QUESTION in kinds:
        out.extend(_questions(fmt))
    if KIND_ANSWER in kinds:
        out.extend(_answers(fmt))
    return out


def memory_candidate(text: str) -> Candidate:
    """A candidate for a response learned from training data."""
    kind = classify_response(text)
    if kind == KIND_DECISION:
        low = text.strip().lower()
        if low == DECISION_ACCEPT.lower():
            return Candidate(DECISION_ACCEPT, KIND_DECISION, "decision:accept")
        if low == DECISION_REJECT.lower():
            return Candidate(DECISION_REJECT, KIND_DECISION, "decision:reject")
    return Candidate(text, kind, MEMORY_TEMPLATE)


def build_pool(fmt: ResponseFormat, memory: list[Candidate], extra: tuple[Candidate, ...] = ()) -> list[Candidate]:
    """Generated candidates, then learned ones of an allowed kind, without duplicate texts."""
    kinds = fmt.kinds
    pool = generate_candidates(fmt)
    seen = {c.text for c in pool}
    for cand in (*memory, *extra):
        if cand.text not in seen and (cand.kind in kinds or cand in extra):
            pool.append(cand)
            seen.add(cand.text)
    return pool
