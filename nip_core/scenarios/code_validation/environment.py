"""``CodeValidationEnvironment``: the pure-text environment with question, solution and stance."""

from __future__ import annotations

from typing import Any

import numpy as np

from nip_core.environments.pure_text_env import PureTextEnvironment


class CodeValidationEnvironment(PureTextEnvironment):
    """Adds ``question``, ``solution`` (strings) and ``prover_stance`` (int) to the state.

    Test accuracy is broken down by the mutation that made a solution buggy (:meth:`datapoint_kind`).
    """

    def datapoint_fields(self, datapoint: Any) -> dict[str, Any]:
        q = np.empty((), dtype=object)
        q[()] = datapoint.question
        s = np.empty((), dtype=object)
        s[()] = datapoint.solution
        return {"question": q, "solution": s, "prover_stance": np.int64(int(datapoint.prover_stance))}

    def datapoint_kind(self, datapoint: Any) -> str | None:
        """``correct`` for a correct solution, else the mutation that broke it (``buggy``: not recorded)."""
        if int(datapoint.y) == 1:
            return "correct"
        return datapoint.mutation or "buggy"
