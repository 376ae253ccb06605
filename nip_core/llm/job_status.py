"""The statuses of fine-tune jobs as nipflow's text agents record them.

OpenAI's job statuses, with its two waiting states (``validating_files``, ``queued``) merged
into ``pending``; a status the map does not know is kept as it is (and logged by the agent).
A job in a terminal status never changes again. Kept apart from the agents (which import
torch) so that the flows that only wait on jobs import nothing heavy.
"""

from __future__ import annotations

STATUS_MAP = {"validating_files": "pending", "queued": "pending", "running": "running", "paused": "paused",
              "succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
