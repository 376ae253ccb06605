"""TensorDict operators wrapping combined agents for the TensorDict trainers.

``PolicyOperator`` writes the logits, the sampled actions and their joint per-agent
log-probability (``("agents", "sample_log_prob")``, ``(B, A)``) into an environment
tensordict; ``ValueOperator`` writes ``("agents", "value")`` ``(B, A, 1)``. Both take
any combined-agents module with ``policy(td)`` / ``value(td)`` methods.
"""

from __future__ import annotations

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.envs.utils import ExplorationType, exploration_type

from nip_core.agents.distributions import joint_log_prob_and_entropy, sample_actions


class PolicyOperator(TensorDictModuleBase):
    """Sample every agent's message and decision from the combined policy.

    Under TorchRL's ``set_exploration_type(DETERMINISTIC)`` (or ``MODE``) the most likely
    action is taken instead (greedy test loops).
    """

    def __init__(self, agents: nn.Module, message_out_key: str, in_keys: list):
        super().__init__()
        self.agents = agents
        self.message_out_key = message_out_key
        self.in_keys = list(in_keys)
        self.out_keys = [("agents", "main_message_logits"), ("agents", "decision_logits"),
                         ("agents", message_out_key), ("agents", "decision"), ("agents", "sample_log_prob")]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        message_logits, decision_logits = self.agents.policy(td)
        if exploration_type() in (ExplorationType.DETERMINISTIC, ExplorationType.MODE):
            message, decision = message_logits.detach().argmax(-1), decision_logits.detach().argmax(-1)
        else:
            message, decision = sample_actions(message_logits.detach(), decision_logits.detach())
        log_prob, _ = joint_log_prob_and_entropy(message_logits, decision_logits, message, decision)
        td.set(("agents", "main_message_logits"), message_logits)
        td.set(("agents", "decision_logits"), decision_logits)
        td.set(("agents", self.message_out_key), message)
        td.set(("agents", "decision"), decision)
        td.set(("agents", "sample_log_prob"), log_prob.detach())
        return td


class ValueOperator(TensorDictModuleBase):
    """Write the critic's per-agent values."""

    def __init__(self, agents: nn.Module, in_keys: list):
        super().__init__()
        self.agents = agents
        self.in_keys = list(in_keys)
        self.out_keys = [("agents", "value")]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td.set(("agents", "value"), self.agents.value(td))
        return td
