"""Stackelberg policy-gradient loss and its opponent-shaping variants (docs/behaviour.md#b27).

Variants: ``spg``/``pspg`` (Stackelberg: the leader's gradient is corrected through the
follower's best response, using a Nyström inverse-Hessian-vector product), ``lola``/``pola``
(opponent shaping with the follower's learning step), ``sos``/``psos`` (stable opponent
shaping). ``p*`` variants use the PPO clipped surrogate as the per-agent gain; the others
use ``mean_b exp(log_prob_i) A_a``.

``forward`` builds the gain matrix ``loss[i, a] = -gain_a(policy of i)``; agent ``a``'s
objective is ``L_a = sum_i loss[i, a]``. ``backward`` computes the shaped actor gradients
and writes them to ``.grad``, then backpropagates the critic and entropy terms.

Deliberate fixes of the original: the leader term of the IHVP is ``∇_{θ_F} L_L`` (the
original used ``loss[L, L]``, which does not depend on θ_F, so the correction was always
zero); the simultaneous gradient ``ξ`` is a copy, not an alias of the total
derivative being corrected; LOLA/POLA without ``additional_lola_term`` simply
omit that term (all three: docs/behaviour.md#b27).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from nip_core.trainers.objectives.base import NipLossModule
from nip_core.trainers.objectives.nystrom import conjugate_gradient_ihvp, nystrom_ihvp

Vec = list[Tensor]


def _grad(output: Tensor, params: list[Tensor]) -> Vec:
    """Detached ``∇_params output`` (zeros for parameters it does not depend on)."""
    grads = torch.autograd.grad(output, params, retain_graph=True, allow_unused=True)
    return [(g if g is not None else torch.zeros_like(p)).detach() for g, p in zip(grads, params)]


def _dot(a: Vec, b: Vec) -> Tensor:
    """``⟨a, b⟩`` over all tensors of the two vectors."""
    return sum((x * y).sum() for x, y in zip(a, b))


def _axpy(alpha, x: Vec, y: Vec) -> Vec:
    """``α x + y``."""
    return [alpha * xi + yi for xi, yi in zip(x, y)]


def _zeros_like(x: Vec) -> Vec:
    return [torch.zeros_like(t) for t in x]


def compute_sos_update(xi: Vec, hgp: Vec, chi: Vec, a: float, b: float) -> Vec:
    """Stable opponent shaping: ``ξ0 - p χ`` with ``ξ0 = ξ - H`` and the SOS choice of ``p``."""
    xi_0 = [x - h for x, h in zip(xi, hgp)]
    chi_dot = _dot(chi, xi_0)
    if -chi_dot >= 0:
        p1 = torch.tensor(1.0)
    else:
        p1 = torch.clamp(a * _dot(xi_0, xi_0) / chi_dot, max=1.0)
    xi_norm = _dot(xi, xi)
    p2 = xi_norm if xi_norm < b**2 else torch.tensor(1.0)
    p = torch.minimum(p1, p2)
    return [x - p * c for x, c in zip(xi_0, chi)]


class PolicyGradients:
    """First-order gradients of one minibatch, detached.

    With ``L_a = Σ_i loss[i, a]`` agent ``a``'s objective and ``θ_a`` its actor parameters:

    * ``cross[(a, b)] = ∇_{θ_b} L_a`` (``cross[(a, a)]`` is agent ``a``'s own gradient);
    * ``score[a] = ∇_{θ_a} Σ_b Σ_i log π_i`` (the score function of the taken actions).
    """

    def __init__(self, losses: TensorDictBase, names: list[str], params: dict[str, list[Tensor]]):
        index = {n: i for i, n in enumerate(names)}
        matrix = losses["loss_matrix"]
        #: ``L_a`` (graph attached).
        self.objective = {n: matrix[:, index[n]].sum() for n in names}
        #: ``loss[a, a]``: agent ``a``'s gain on its own policy (graph attached).
        self.own_loss = {n: matrix[index[n], index[n]] for n in names}
        self.score = {n: _grad(losses["sum_log_probs"], params[n]) for n in names}
        self.cross = {(a, b): _grad(self.objective[a], params[b]) for a in names for b in names}


class SpgLoss(NipLossModule):
    """Gain matrix, entropy and critic losses; shaped gradients in :meth:`backward`."""

    out_keys = ["loss_objective", "loss_critic", "loss_entropy", "entropy"]
    loss_terms = ("loss_entropy", "loss_critic")  # the actor term's gradient is shaped separately

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, stackelberg_sequence,
                 use_critic: bool = True):
        super().__init__(agents, hyper_params, message_key, use_critic)
        spg = hyper_params.spg
        self.variant = spg.variant
        self.clip_epsilon = hyper_params.ppo.clip_epsilon
        self.sequence = [list(group) for group in (spg.stackelberg_sequence or stackelberg_sequence)]
        self.names = list(agents.agent_names)
        self.ihvp_generator = torch.Generator().manual_seed(hyper_params.seed)

    def get_extra_state(self):
        # The IHVP row choice is random: checkpoint its generator for exact resumes.
        return {"ihvp_generator": self.ihvp_generator.get_state()}

    def set_extra_state(self, state) -> None:
        self.ihvp_generator.set_state(state["ihvp_generator"])

    # -- forward ------------------------------------------------------------------------------

    def forward(self, td: TensorDictBase) -> TensorDict:
        log_prob, entropy = self.log_prob_and_entropy(td)
        advantage = self.advantage(td)  # (n, A)
        if self.variant in ("pspg", "pola", "psos"):
            ratio = (log_prob - td[self.tensor_keys.sample_log_prob]).exp()  # (n, I)
            clipped = ratio.clamp(1 - self.clip_epsilon, 1 + self.clip_epsilon)
            gain = torch.minimum(ratio[:, :, None] * advantage[:, None, :],
                                 clipped[:, :, None] * advantage[:, None, :]).mean(0)  # (I, A)
        else:
            gain = (log_prob.exp()[:, :, None] * advantage[:, None, :]).mean(0)
        matrix = -gain  # loss[i, a]
        entropy_loss = self.entropy_term(entropy)
        out = {"loss_objective": matrix.diagonal().sum(), "loss_entropy": entropy_loss.sum(),
               "entropy": self.logged_entropy(entropy), "loss_matrix": matrix, "sum_log_probs": log_prob.sum()}
        per_agent = {"loss_objective": matrix.diagonal(), "loss_entropy": entropy_loss}
        if self.use_critic:
            critic = self.critic_term(self.agents.value(td), td)
            out["loss_critic"] = critic.sum()
            per_agent["loss_critic"] = critic
        return self.pack(out, per_agent, len(self.names))

    # -- the shaped actor gradients -------------------------------------------------------------

    def follower_structure(self) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
        """``(immediate, every, leaders)`` of the Stackelberg sequence.

        ``immediate[a]``: the agents of the group right after ``a``'s; ``every[a]``: all agents
        of later groups; ``leaders[f]``: the agents ``f`` is an immediate follower of.
        """
        immediate, every, leaders = {}, {}, {n: [] for n in self.names}
        for g, group in enumerate(self.sequence):
            for name in group:
                immediate[name] = list(self.sequence[g + 1]) if g + 1 < len(self.sequence) else []
                every[name] = [f for later in self.sequence[g + 1:] for f in later]
                for f in immediate[name]:
                    leaders[f].append(name)
        return immediate, every, leaders

    def inverse_hessian_vector_product(self, follower_loss: Tensor, leader_loss: Tensor,
                                       params: list[Tensor]) -> Vec:
        """``(H_F + ρI)⁻¹ ∇_{θ_F} L_L`` with ``H_F = ∇²_{θ_F} follower_loss``.

        By ``spg.ihvp_variant``: Nyström (``spg.ihvp_rank`` sampled Hessian rows, drawn with
        the checkpointed generator) or conjugate gradients (``spg.ihvp_num_iterations``).
        """
        spg = self.hp.spg
        if spg.ihvp_variant == "conj_grad":
            return conjugate_gradient_ihvp(follower_loss, leader_loss, params, spg.ihvp_num_iterations, spg.ihvp_rho)
        return nystrom_ihvp(follower_loss, leader_loss, params, spg.ihvp_rank, spg.ihvp_rho,
                            generator=self.ihvp_generator)

    @staticmethod
    def chained_response_coefficients(follower: str, leaders_of_follower: list[str], grads: PolicyGradients,
                                      coeff_gradient: dict[str, Vec], coeff_score: dict[str, Vec],
                                      like: Vec) -> tuple[Vec, Vec]:
        """Coefficients of a non-immediate follower's response, through its own leaders ``m``.

        ``c_∇[F] = Σ_m ⟨∇_{θ_m} L_F, s_m⟩ c_∇[m] + ⟨∇_{θ_m} L_F, ∇_{θ_m} L_m⟩ c_s[m]`` and
        ``c_s[F] = Σ_m ⟨s_m, s_m⟩ c_∇[m] + ⟨s_m, ∇_{θ_m} L_m⟩ c_s[m]`` (``s`` the scores), over
        the leaders ``m`` whose coefficients are known; an immediate follower ``F`` of ``L``
        has ``c_∇[F] = ∇_{θ_L} L_F`` and ``c_s[F] = s_L``.
        """
        via_gradient, via_score = _zeros_like(like), _zeros_like(like)
        for mid in leaders_of_follower:
            if mid not in coeff_gradient:
                continue
            cross_mid = grads.cross[(follower, mid)]
            gradient_score = _dot(cross_mid, grads.score[mid])
            gradient_gradient = _dot(cross_mid, grads.cross[(mid, mid)])
            score_score = _dot(grads.score[mid], grads.score[mid])
            score_gradient = _dot(grads.score[mid], grads.cross[(mid, mid)])
            via_gradient = _axpy(gradient_score, coeff_gradient[mid],
                                 _axpy(gradient_gradient, coeff_score[mid], via_gradient))
            via_score = _axpy(score_score, coeff_gradient[mid], _axpy(score_gradient, coeff_score[mid], via_score))
        return via_gradient, via_score

    @staticmethod
    def leader_follower_cross_term(multiplier: Vec, follower_score: Vec, follower_gradient: Vec,
                                   coeff_gradient: Vec, coeff_score: Vec) -> Vec:
        """``J_{LF} m``: the mixed second derivative of ``L_F`` applied to the multiplier ``m``.

        With the score-function estimate ``∇_{θ_L}∇_{θ_F} L_F ≈ c_∇ s_Fᵀ + c_s (∇_{θ_F} L_F)ᵀ``
        (``c_∇ = ∇_{θ_L} L_F``, ``c_s = s_L`` for an immediate follower)::

            J_{LF} m = ⟨m, s_F⟩ c_∇ + ⟨m, ∇_{θ_F} L_F⟩ c_s
        """
        along_score, along_gradient = _dot(multiplier, follower_score), _dot(multiplier, follower_gradient)
        return _axpy(along_score, coeff_gradient, [along_gradient * x for x in coeff_score])

    @staticmethod
    def lola_correction(grads: PolicyGradients, leader: str, follower: str, follower_total: Vec) -> Vec:
        """LOLA's additional term ``⟨s_F, g_F⟩ ∇_{θ_L} L_L + ⟨∇_{θ_F} L_L, g_F⟩ s_L``.

        ``g_F`` is the follower's (already shaped) total gradient.
        """
        along_score = _dot(grads.score[follower], follower_total)
        along_leader = _dot(grads.cross[(leader, follower)], follower_total)
        return _axpy(along_score, grads.cross[(leader, leader)], [along_leader * x for x in grads.score[leader]])

    def stackelberg_policy_gradient(self, losses: TensorDictBase,
                                    params: dict[str, list[Tensor]]) -> dict[str, Vec]:
        """The shaped actor gradient of every agent, last group of the sequence first.

        For each leader ``L`` and each later agent ``F``, with step size ``η_F`` (1 for
        ``spg``/``pspg``, ``agent_lr_factor.actor · rl.lr`` otherwise)::

            m      = (H_F + ρI)⁻¹ ∇_{θ_F} L_L   (spg, pspg: inverse_hessian_vector_product)
                   = ∇_{θ_F} L_L                 (lola, pola, sos, psos)
            g_L   -= η_F (J_{LF} m + h_{LF})     (leader_follower_cross_term, lola_correction)

        starting from ``g_L = ∇_{θ_L} L_L``; ``h_{LF}`` (:meth:`lola_correction`) is zero for
        ``spg``/``pspg``, and for ``lola``/``pola`` unless ``spg.additional_lola_term``. SOS/PSOS then combine
        ``ξ = (∇_{θ_a} L_a)_a``, ``χ = Σ η J m`` and ``H = Σ η h`` (:func:`compute_sos_update`).
        """
        grads = PolicyGradients(losses, self.names, params)
        immediate, every, leaders_of = self.follower_structure()
        stackelberg = self.variant in ("spg", "pspg")
        use_lola_term = not stackelberg and (self.hp.spg.additional_lola_term or self.variant in ("sos", "psos"))
        own = {n: grads.cross[(n, n)] for n in self.names}
        total = {n: [x.clone() for x in own[n]] for n in self.names}
        simultaneous = {n: [x.clone() for x in own[n]] for n in self.names}  # ξ
        shaping_sum = {n: _zeros_like(own[n]) for n in self.names}  # χ
        lola_sum = {n: _zeros_like(own[n]) for n in self.names}  # H
        for group in reversed(self.sequence):
            for lead in group:
                coeff_gradient, coeff_score = {}, {}
                for f in every[lead]:
                    if f in immediate[lead]:
                        coeff_gradient[f], coeff_score[f] = grads.cross[(f, lead)], grads.score[lead]
                    else:
                        coeff_gradient[f], coeff_score[f] = self.chained_response_coefficients(
                            f, leaders_of[f], grads, coeff_gradient, coeff_score, own[lead])
                    if stackelberg:
                        multiplier = [m.detach() for m in self.inverse_hessian_vector_product(
                            grads.own_loss[f], grads.objective[lead], params[f])]
                        step = 1.0
                    else:
                        multiplier = grads.cross[(lead, f)]
                        step = self.hp.agent_params(f).agent_lr_factor.actor * self.hp.rl.lr
                    shaping = self.leader_follower_cross_term(multiplier, grads.score[f], own[f],
                                                              coeff_gradient[f], coeff_score[f])
                    if use_lola_term:
                        correction = self.lola_correction(grads, lead, f, total[f])
                    else:
                        correction = _zeros_like(own[lead])
                    shaping_sum[lead] = _axpy(step, shaping, shaping_sum[lead])
                    lola_sum[lead] = _axpy(step, correction, lola_sum[lead])
                    total[lead] = [t - step * (s + h) for t, s, h in zip(total[lead], shaping, correction)]
        if self.variant not in ("sos", "psos"):
            return total
        flat = compute_sos_update([x for n in self.names for x in simultaneous[n]],
                                  [x for n in self.names for x in lola_sum[n]],
                                  [x for n in self.names for x in shaping_sum[n]],
                                  self.hp.spg.sos_scaling_factor, self.hp.spg.sos_threshold_factor)
        update, offset = {}, 0
        for n in self.names:
            update[n] = flat[offset:offset + len(simultaneous[n])]
            offset += len(simultaneous[n])
        return update

    def backward(self, losses: TensorDictBase) -> None:
        """Critic and entropy gradients by autograd, plus the shaped actor gradients in ``.grad``."""
        params = {n: self.agents.actor_parameters(n) for n in self.names}
        update = self.stackelberg_policy_gradient(losses, params)
        self.sum_losses(losses).backward()  # critic/entropy gradients first (this also frees the graph) ...
        for n in self.names:  # ... then add the shaped actor gradients
            for p, u in zip(params[n], update[n]):
                p.grad = u.clone() if p.grad is None else p.grad + u
