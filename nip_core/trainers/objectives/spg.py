"""Stackelberg policy-gradient loss and its opponent-shaping variants (``nip_spec.md`` §5.3).

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
zero — QUIRK 10); the simultaneous gradient ``ξ`` is a copy, not an alias of the total
derivative being corrected (QUIRK 11); LOLA/POLA without ``additional_lola_term`` simply
omit that term (QUIRK 12).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from nip_core.agents.distributions import joint_log_prob_and_entropy
from nip_core.trainers.objectives.common import critic_loss, normalized_advantage, resolve_clip_value
from nip_core.trainers.objectives.nystrom import conjugate_gradient_ihvp, nystrom_ihvp

Vec = list[Tensor]


def _grad(output: Tensor, params: list[Tensor]) -> Vec:
    grads = torch.autograd.grad(output, params, retain_graph=True, allow_unused=True)
    return [(g if g is not None else torch.zeros_like(p)).detach() for g, p in zip(grads, params)]


def _dot(a: Vec, b: Vec) -> Tensor:
    return sum((x * y).sum() for x, y in zip(a, b))


def _axpy(alpha, x: Vec, y: Vec) -> Vec:
    return [alpha * xi + yi for xi, yi in zip(x, y)]


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


class SpgLoss(nn.Module):
    """Gain matrix, entropy and critic losses; shaped gradients in :meth:`backward`."""

    out_keys = ["loss_objective", "loss_critic", "loss_entropy", "entropy"]

    def __init__(self, agents: nn.Module, hyper_params, message_key: str, stackelberg_sequence,
                 use_critic: bool = True):
        super().__init__()
        self.agents = agents
        self.hp = hyper_params
        self.message_key = message_key
        self.use_critic = use_critic
        spg = hyper_params.spg
        self.variant = spg.variant
        self.sequence = [list(group) for group in (spg.stackelberg_sequence or stackelberg_sequence)]
        self.names = list(agents.agent_names)
        self.in_keys = [("agents", message_key), ("agents", "decision"), ("agents", "sample_log_prob"),
                        ("agents", "advantage"), ("agents", "value_target"), ("agents", "value")]
        self.clip_value = resolve_clip_value(hyper_params)
        self.ihvp_generator = torch.Generator().manual_seed(hyper_params.seed)

    def get_extra_state(self):
        # The IHVP row choice is random: checkpoint its generator for exact resumes.
        return {"ihvp_generator": self.ihvp_generator.get_state()}

    def set_extra_state(self, state) -> None:
        self.ihvp_generator.set_state(state["ihvp_generator"])

    def _ihvp(self, follower_loss, leader_loss, params):
        """``(H_F + ρI)⁻¹ ∇ leader_loss`` by ``spg.ihvp_variant`` (Nyström or conjugate gradients)."""
        spg = self.hp.spg
        if spg.ihvp_variant == "conj_grad":
            return conjugate_gradient_ihvp(follower_loss, leader_loss, params, spg.ihvp_num_iterations, spg.ihvp_rho)
        return nystrom_ihvp(follower_loss, leader_loss, params, spg.ihvp_rank, spg.ihvp_rho,
                            generator=self.ihvp_generator)

    # -- forward ------------------------------------------------------------------------------

    def forward(self, td: TensorDictBase) -> TensorDict:
        ppo = self.hp.ppo
        message_logits, decision_logits = self.agents.policy(td)
        log_prob, entropy = joint_log_prob_and_entropy(message_logits, decision_logits,
                                                       td["agents", self.message_key], td["agents", "decision"])
        advantage = normalized_advantage(td, ppo.normalize_advantage)  # (n, A)
        if self.variant in ("pspg", "pola", "psos"):
            ratio = (log_prob - td["agents", "sample_log_prob"]).exp()  # (n, I)
            clipped = ratio.clamp(1 - ppo.clip_epsilon, 1 + ppo.clip_epsilon)
            gain = torch.minimum(ratio[:, :, None] * advantage[:, None, :],
                                 clipped[:, :, None] * advantage[:, None, :]).mean(0)  # (I, A)
        else:
            gain = (log_prob.exp()[:, :, None] * advantage[:, None, :]).mean(0)
        matrix = -gain  # loss[i, a]
        entropy_loss = -ppo.entropy_eps * entropy.mean(0)
        out = {"loss_objective": matrix.diagonal().sum(), "loss_entropy": entropy_loss.sum(),
               "entropy": entropy.mean().detach(), "loss_matrix": matrix, "sum_log_probs": log_prob.sum()}
        per_agent = {"loss_objective": matrix.diagonal(), "loss_entropy": entropy_loss}
        if self.use_critic:
            critic = ppo.critic_coef * critic_loss(self.agents.value(td), td, self.hp.rl.loss_critic_type,
                                                   self.clip_value)
            out["loss_critic"] = critic.sum()
            per_agent["loss_critic"] = critic
        out["agents"] = TensorDict(per_agent, batch_size=[len(self.names)])
        return TensorDict(out, batch_size=[])

    # -- backward -----------------------------------------------------------------------------

    def _followers(self) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
        immediate, every, leaders = {}, {}, {n: [] for n in self.names}
        for g, group in enumerate(self.sequence):
            for name in group:
                immediate[name] = list(self.sequence[g + 1]) if g + 1 < len(self.sequence) else []
                every[name] = [f for later in self.sequence[g + 1:] for f in later]
                for f in immediate[name]:
                    leaders[f].append(name)
        return immediate, every, leaders

    def backward(self, losses: TensorDictBase) -> None:
        idx = {n: i for i, n in enumerate(self.names)}
        params = {n: self.agents.actor_parameters(n) for n in self.names}
        matrix = losses["loss_matrix"]
        objective = {n: matrix[:, idx[n]].sum() for n in self.names}  # L_a = sum_i loss[i, a]
        scores = {n: _grad(losses["sum_log_probs"], params[n]) for n in self.names}
        g = {(lead, f): _grad(objective[lead], params[f]) for lead in self.names for f in self.names}
        immediate, every, leaders_of = self._followers()
        stackelberg = self.variant in ("spg", "pspg")
        lr = self.hp.rl.lr
        total = {n: [x.clone() for x in g[(n, n)]] for n in self.names}
        xi = {n: [x.clone() for x in g[(n, n)]] for n in self.names}
        chi = {n: [torch.zeros_like(x) for x in g[(n, n)]] for n in self.names}
        hgp_acc = {n: [torch.zeros_like(x) for x in g[(n, n)]] for n in self.names}
        use_hgp = not stackelberg and (self.hp.spg.additional_lola_term or self.variant in ("sos", "psos"))
        for group in reversed(self.sequence):
            for lead in group:
                coeff_s, coeff_pg = {}, {}
                for f in every[lead]:
                    if f in immediate[lead]:
                        coeff_s[f], coeff_pg[f] = g[(f, lead)], scores[lead]
                    else:
                        cs = [torch.zeros_like(x) for x in g[(lead, lead)]]
                        cpg = [torch.zeros_like(x) for x in g[(lead, lead)]]
                        for mid in leaders_of[f]:
                            if mid not in coeff_s:
                                continue
                            a1, a2 = _dot(g[(f, mid)], scores[mid]), _dot(g[(f, mid)], g[(mid, mid)])
                            b1, b2 = _dot(scores[mid], scores[mid]), _dot(scores[mid], g[(mid, mid)])
                            cs = _axpy(a1, coeff_s[mid], _axpy(a2, coeff_pg[mid], cs))
                            cpg = _axpy(b1, coeff_s[mid], _axpy(b2, coeff_pg[mid], cpg))
                        coeff_s[f], coeff_pg[f] = cs, cpg
                    if stackelberg:
                        multiplier = [m.detach() for m in self._ihvp(matrix[idx[f], idx[f]], objective[lead],
                                                                     params[f])]
                        c = 1.0
                    else:
                        multiplier = g[(lead, f)]
                        c = self.hp.agent_params(f).agent_lr_factor.actor * lr
                    os_s, os_pg = _dot(multiplier, scores[f]), _dot(multiplier, g[(f, f)])
                    shaping = _axpy(os_s, coeff_s[f], [os_pg * x for x in coeff_pg[f]])
                    if use_hgp:
                        hgp_pg, hgp_s = _dot(scores[f], total[f]), _dot(g[(lead, f)], total[f])
                        hgp = _axpy(hgp_pg, g[(lead, lead)], [hgp_s * x for x in scores[lead]])
                    else:
                        hgp = [torch.zeros_like(x) for x in g[(lead, lead)]]
                    chi[lead] = _axpy(c, shaping, chi[lead])
                    hgp_acc[lead] = _axpy(c, hgp, hgp_acc[lead])
                    total[lead] = [t - c * (s + h) for t, s, h in zip(total[lead], shaping, hgp)]
        if self.variant in ("sos", "psos"):
            flat = compute_sos_update([x for n in self.names for x in xi[n]],
                                      [x for n in self.names for x in hgp_acc[n]],
                                      [x for n in self.names for x in chi[n]],
                                      self.hp.spg.sos_scaling_factor, self.hp.spg.sos_threshold_factor)
            update, offset = {}, 0
            for n in self.names:
                update[n] = flat[offset:offset + len(xi[n])]
                offset += len(xi[n])
        else:
            update = total
        rest = losses["loss_entropy"]
        if "loss_critic" in losses.keys():
            rest = rest + losses["loss_critic"]
        rest.backward()  # critic/entropy gradients first (this also frees the graph) ...
        for n in self.names:  # ... then add the shaped actor gradients
            for p, u in zip(params[n], update[n]):
                p.grad = u.clone() if p.grad is None else p.grad + u
