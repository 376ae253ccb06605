"""``NipLossModule``: the TorchRL ``LossModule`` base of the RL losses (PPO, REINFORCE, SPG).

The base owns what every loss shares:

* the tensordict keys it reads, declared in :class:`NipLossModule._AcceptedKeys` and
  renamed with ``set_keys`` (per-agent keys live under ``"agents"``);
* the value estimator: ``default_value_estimator`` is GAE, and
  ``make_value_estimator(ValueEstimators.GAE, gamma=..., lmbda=...)`` builds the
  per-agent GAE the trainers use (``gamma``/``lmbda`` default to ``rl.gamma``/``rl.lmbda``);
* the log-probabilities and entropies of the taken actions, the (normalised) advantage,
  the critic and entropy terms, and the sum of the ``loss_*`` terms that ``backward``
  differentiates.

Subclasses implement ``forward`` (their own objective) and name their summed terms in
:attr:`NipLossModule.loss_terms`; SPG overrides ``backward``.

The value estimator is not a registered submodule: its only state (``gamma``, ``lmbda``)
comes from the hyper-parameters, so the loss's ``state_dict`` (part of every checkpoint)
stays exactly what it was before losses were ``LossModule``\\ s. ``.to(...)`` still moves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import Tensor, nn
from torchrl.objectives import LossModule, ValueEstimators
from torchrl.objectives.value import GAE

from nip_core.agents.distributions import joint_log_prob_and_entropy
from nip_core.trainers.objectives.common import critic_loss, normalized_advantage, resolve_clip_value


class NipLossModule(LossModule):
    """Base of the per-agent RL losses.

    Parameters
    ----------
    agents
        The combined agents (``policy``, ``value``, ``policy_and_value``, ``agent_names``).
    hyper_params
        The experiment's hyper-parameters (``ppo.*``, ``rl.*`` are read here).
    message_key
        Name of the message action under ``"agents"``: the default of the ``action`` key.
    use_critic
        Whether the critic term is part of the loss.
    """

    @dataclass
    class _AcceptedKeys:
        """Tensordict keys the losses read (per agent under ``"agents"``) and GAE writes.

        Attributes
        ----------
        action
            The message action (the constructor's ``message_key``).
        decision
            The verifier's decision action.
        sample_log_prob
            Log-probability of the taken actions under the collecting policy.
        advantage, value_target
            GAE's outputs.
        value
            The critic's value at collection time (for value clipping and GAE).
        reward, done, terminated
            GAE's inputs (under ``"next"``).
        reward_to_go
            Discounted return per step (REINFORCE without critic).
        """

        action: NestedKey = ("agents", "message")
        decision: NestedKey = ("agents", "decision")
        sample_log_prob: NestedKey = ("agents", "sample_log_prob")
        advantage: NestedKey = ("agents", "advantage")
        value_target: NestedKey = ("agents", "value_target")
        value: NestedKey = ("agents", "value")
        reward: NestedKey = ("agents", "reward")
        done: NestedKey = ("agents", "done")
        terminated: NestedKey = ("agents", "terminated")
        reward_to_go: NestedKey = ("agents", "reward_to_go")

    default_value_estimator = ValueEstimators.GAE
    #: The ``loss_*`` entries summed (in this order) by :meth:`sum_losses`.
    loss_terms: tuple[str, ...] = ()
    #: Names of :class:`_AcceptedKeys` fields ``forward`` reads (its ``in_keys``).
    read_keys: tuple[str, ...] = ("action", "decision", "sample_log_prob", "advantage", "value_target", "value")

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, use_critic: bool = True):
        super().__init__()
        self.agents = agents
        self.hp = hyper_params
        self.use_critic = use_critic
        ppo = hyper_params.ppo
        self.entropy_coef = ppo.entropy_eps
        self.critic_coef = ppo.critic_coef
        self.normalize_advantage = ppo.normalize_advantage
        self.loss_critic_type = hyper_params.rl.loss_critic_type
        self.clip_value = resolve_clip_value(hyper_params)
        self._message_key = message_key
        self.set_keys(action=("agents", message_key))

    # -- keys and value estimator -------------------------------------------------------------

    def minibatch_source(self, batch: TensorDictBase) -> TensorDictBase:
        """What the update's minibatches are drawn from: ``batch`` without its ``"next"`` half.

        ``forward`` reads the step's own entries (:attr:`read_keys` and the agents' observations),
        nothing of the next step once the advantages are in. Sampling a minibatch indexes every
        leaf, and ``"next"`` holds 16 of a GI batch's 38 leaves and half its bytes. (The trainer
        hands a loss module without this method the whole batch.)
        """
        return batch.exclude("next")

    def default_keys(self) -> _AcceptedKeys:
        """The keys ``set_keys(name=None)`` goes back to (``action`` is the message key)."""
        return self._AcceptedKeys(action=("agents", self._message_key))

    def _set_in_keys(self) -> None:
        self.in_keys = [getattr(self.tensor_keys, name) for name in self.read_keys]

    def __setattr__(self, name: str, value) -> None:
        if name == "_value_estimator":  # kept out of the module tree and the state_dict (module doc)
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self._value_estimator is not None:
            self._value_estimator._apply(fn)
        return out

    def make_value_estimator(self, value_type: ValueEstimators = None, **hyperparams):
        """Build the value estimator; GAE reads and writes this loss's (per-agent) keys.

        Parameters
        ----------
        value_type
            ``ValueEstimators.GAE`` (the default), or a ``ValueEstimatorBase`` instance or
            subclass (TorchRL's behaviour). Other ``ValueEstimators`` are refused.
        **hyperparams
            Keyword arguments of TorchRL's ``GAE``; ``gamma`` and ``lmbda`` default to
            ``rl.gamma`` and ``rl.lmbda``, ``value_network`` to ``None`` (the trainer
            supplies the values).

        Returns
        -------
        NipLossModule
            ``self``.
        """
        if value_type is None:
            value_type = self.default_value_estimator
        if not isinstance(value_type, ValueEstimators):
            return super().make_value_estimator(value_type, **hyperparams)
        if value_type != ValueEstimators.GAE:
            raise NotImplementedError(f"value_type: {value_type} is not implemented for {type(self).__name__} "
                                      f"(only ValueEstimators.GAE)")
        hyperparams.setdefault("gamma", self.hp.rl.gamma)
        hyperparams.setdefault("lmbda", self.hp.rl.lmbda)
        hyperparams.setdefault("value_network", None)
        self.value_type = value_type
        self._value_estimator = GAE(**hyperparams)
        self._forward_value_estimator_keys()
        return self

    # -- shared terms ---------------------------------------------------------------------------

    def log_prob_and_entropy(self, td: TensorDictBase, logits=None) -> tuple[Tensor, Tensor]:
        """``(log_prob, entropy)`` of the taken actions, each ``(n, A)``.

        ``logits``: ``(message_logits, decision_logits)`` already computed (else the policy runs).
        """
        message_logits, decision_logits = self.agents.policy(td) if logits is None else logits
        return joint_log_prob_and_entropy(message_logits, decision_logits,
                                          td[self.tensor_keys.action], td[self.tensor_keys.decision])

    def log_weight_and_entropy(self, td: TensorDictBase, logits=None) -> tuple[Tensor, Tensor, Tensor]:
        """``(log_prob, log_weight, entropy)``, each ``(n, A)``; ``log_weight = log π - log π_old``."""
        log_prob, entropy = self.log_prob_and_entropy(td, logits)
        return log_prob, log_prob - td[self.tensor_keys.sample_log_prob], entropy

    def advantage(self, td: TensorDictBase) -> Tensor:
        """``(n, A)`` advantages, normalised per agent when ``ppo.normalize_advantage``."""
        return normalized_advantage(td, self.normalize_advantage, key=self.tensor_keys.advantage)

    def entropy_term(self, entropy: Tensor) -> Tensor:
        """Per-agent ``(A,)`` entropy bonus ``-c_H mean_b H_a``."""
        return -self.entropy_coef * entropy.mean(0)

    @staticmethod
    def logged_entropy(entropy: Tensor) -> Tensor:
        """The logged ``entropy``, as nip logs it: ``sum_a mean_b H_a`` (docs/behaviour.md#b15)."""
        return entropy.mean(0).sum().detach()

    def critic_term(self, value: Tensor, td: TensorDictBase) -> Tensor:
        """Per-agent ``(A,)`` critic term ``c_V ℓ(V_a, V_target_a)`` (``rl.loss_critic_type``, clipped)."""
        return self.critic_coef * critic_loss(value, td, self.loss_critic_type, self.clip_value,
                                              target_key=self.tensor_keys.value_target,
                                              value_key=self.tensor_keys.value)

    @staticmethod
    def pack(out: dict, per_agent: dict, num_agents: int) -> TensorDict:
        """The loss tensordict: scalar entries plus the per-agent ones under ``"agents"``."""
        out["agents"] = TensorDict(per_agent, batch_size=[num_agents])
        return TensorDict(out, batch_size=[])

    def sum_losses(self, losses: TensorDictBase, terms: tuple[str, ...] | None = None) -> Tensor:
        """Sum of the present ``terms`` (default :attr:`loss_terms`), left to right."""
        total = None
        for name in self.loss_terms if terms is None else terms:
            if name in losses.keys():
                total = losses[name] if total is None else total + losses[name]
        if total is None:
            raise KeyError(f"losses: none of the loss terms {list(terms or self.loss_terms)} is present")
        return total

    def backward(self, losses: TensorDictBase) -> None:
        """Backpropagate :meth:`sum_losses` (gradients accumulate in ``.grad``)."""
        self.sum_losses(losses).backward()

