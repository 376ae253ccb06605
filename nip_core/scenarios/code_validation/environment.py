"""``CodeValidationEnvironment``: the pure-text environment with question, solution and stance."""

from __future__ import annotations

from typing import Any

import numpy as np

from nip_core.environments.pure_text_env import PureTextEnvironment


class CodeValidationEnvironment(PureTextEnvironment):
    """Adds ``question``, ``solution`` (strings) and ``prover_stance`` (int) to the state."""

    def datapoint_fields(self, datapoint: Any) -> dict[str, Any]:
        q = np.empty((), dtype=object)
        q[()] = datapoint.question
        s = np.empty((), dtype=object)
        s[()] = datapoint.solution
        return {"question": q, "solution": s, "prover_stance": np.int64(int(datapoint.prover_stance))}
