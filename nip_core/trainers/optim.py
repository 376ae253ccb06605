"""The optimiser of the TensorDict trainers, chosen by ``rl.optimizer``.

Adam with ``eps=1e-5`` is the original library's (and the default). The others take
their usual arguments from ``rl``: ``betas`` (adam, adamw), ``momentum`` (sgd, rmsprop),
``weight_decay`` (all; decoupled for adamw) and ``optimizer_eps`` (all but sgd).
Arguments that an optimiser does not take are refused when the parameters are validated.

Adam and AdamW run PyTorch's fused implementation (one kernel over all parameters instead of
a Python loop of a dozen small ops per tensor) whenever every parameter is a float tensor
on the CPU or CUDA: on the GI paper workload (148 tensors) a step takes about 1 ms instead
of 7 ms on one CPU thread; :class:`FusedAdam` and :class:`FusedAdamW` then make one kernel call
per set of group settings instead of one per group, with torch's per-group Python left out
(bit-identical to torch's fused step; 1.3 ms a step less on that workload), and
:func:`clip_grad_norm` clips as torch does without its per-call Python. Its result differs from
the loop's by float rounding only (within one ulp on the GI agents), and it is deterministic, so
exact resume holds. The choice is
saved in the optimiser's ``state_dict``: a checkpoint written by the loop keeps the loop when
it is resumed, so its continuation stays bit-identical.
"""

from __future__ import annotations

from typing import Any

import torch


def build_optimizer(param_groups: list[dict[str, Any]], rl: Any) -> torch.optim.Optimizer | None:
    """The optimiser over ``param_groups`` (each with its own ``lr``), or None without any."""
    if not param_groups:
        return None
    name = rl.optimizer
    if name in ("adam", "adamw"):
        cls = FusedAdam if name == "adam" else FusedAdamW
        return cls(param_groups, betas=tuple(rl.betas), eps=rl.optimizer_eps, weight_decay=rl.weight_decay,
                   fused=_can_fuse(param_groups))
    if name == "sgd":
        return torch.optim.SGD(param_groups, momentum=rl.momentum, weight_decay=rl.weight_decay)
    if name == "rmsprop":
        return torch.optim.RMSprop(param_groups, momentum=rl.momentum, eps=rl.optimizer_eps,
                                   weight_decay=rl.weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(param_groups, eps=rl.optimizer_eps, weight_decay=rl.weight_decay)
    raise ValueError(f"rl.optimizer: unknown optimiser '{name}'")


def _can_fuse(param_groups: list[dict[str, Any]]) -> bool | None:
    """True when PyTorch's fused Adam(W) takes every parameter (float, on the CPU or CUDA)."""
    params = [p for group in param_groups for p in group["params"]]
    if params and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params):
        return True
    return None  # PyTorch's default (the loop, or foreach on CUDA)


class _OneKernelCallPerSettings:
    """Adam(W)'s fused step with the parameter groups of equal settings in one kernel call.

    torch's fused step goes group by group: a Python loop over the group's parameters, a
    grouping of its tensors by device and dtype, a step-count increment and a kernel call each.
    On the GI paper workload (12 groups, 148 tensors, one CPU thread) that cost about 1.3 ms
    a minibatch step, mostly outside the kernel. Here the parameters with a gradient are
    collected once over all groups, every step count is incremented by one call, and the groups
    with the same settings share one kernel call. The kernel updates each tensor on its own,
    so the result is bit-identical to torch's step. Anything else takes torch's step: a
    closure, a first step (torch creates the state), a group that is not fused, capturable or
    differentiable, a tensor learning rate or beta, a gradient scaler's ``grad_scale`` or
    ``found_inf``, or tensors of more than one device or dtype.
    """

    def step(self, closure=None):
        plan = self._one_call_plan() if closure is None else None
        if plan is None:
            return super().step(closure)
        with torch.no_grad():
            self._one_call_step(plan)
        return None

    @staticmethod
    def _one_call_step(plan: dict[tuple, tuple[list, ...]]) -> None:
        torch._foreach_add_([step for lists in plan.values() for step in lists[5]], 1)
        for (lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled), lists in plan.items():
            kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
            kernel(*lists, amsgrad=amsgrad, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
                   maximize=maximize, grad_scale=None, found_inf=None)

    def _one_call_plan(self) -> dict[tuple, tuple[list, ...]] | None:
        """Per settings, the kernel's lists (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
        steps) of the parameters with a gradient; None where torch's own step must run."""
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            return None
        plan: dict[tuple, tuple[list, ...]] = {}
        kind = None
        for group in self.param_groups:
            betas = group["betas"]
            if (not group["fused"] or group["capturable"] or group["differentiable"]
                    or any(isinstance(v, torch.Tensor) for v in (group["lr"], *betas))):
                return None
            key = (group["lr"], float(betas[0]), float(betas[1]), group["weight_decay"], group["eps"],
                   group["amsgrad"], group["maximize"], group["decoupled_weight_decay"])
            lists = None
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                state = self.state.get(p)
                if not state or grad.is_sparse:
                    return None
                if kind is None:
                    kind = (p.device, p.dtype)
                elif (p.device, p.dtype) != kind:
                    return None
                if lists is None:
                    lists = plan.setdefault(key, ([], [], [], [], [], []))
                lists[0].append(p)
                lists[1].append(grad)
                lists[2].append(state["exp_avg"])
                lists[3].append(state["exp_avg_sq"])
                if group["amsgrad"]:
                    lists[4].append(state["max_exp_avg_sq"])
                lists[5].append(state["step"])
        return plan


class FusedAdam(_OneKernelCallPerSettings, torch.optim.Adam):
    """:class:`torch.optim.Adam` whose fused step makes one kernel call per settings (:class:`_OneKernelCallPerSettings`)."""


class FusedAdamW(_OneKernelCallPerSettings, torch.optim.AdamW):
    """:class:`torch.optim.AdamW` whose fused step makes one kernel call per settings (:class:`_OneKernelCallPerSettings`)."""


class ParamGroupFreezer:
    """Freezes named collections of an optimiser's parameter groups (nip's interface).

    ``param_group_collections`` names lists of the optimiser's parameter groups — one
    collection per agent. :meth:`freeze` and :meth:`unfreeze` may be called at any point;
    the parameters of a frozen collection get no update. nip removes a frozen collection's
    groups from the optimiser; here they stay (the optimiser's state and the checkpoint
    layout never change with an update schedule) and :meth:`frozen_params` lists the
    parameters whose gradients the trainer drops before each optimiser step.

    Raises
    ------
    ValueError
        If a group of a collection is not one of the optimiser's (names the collection).
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None, param_group_collections: dict[str, list[dict]]):
        self.optimizer = optimizer
        self.param_group_collections = dict(param_group_collections)
        self.frozen: set[str] = set()
        own = [id(g) for g in optimizer.param_groups] if optimizer is not None else []
        for name, groups in self.param_group_collections.items():
            for index, group in enumerate(groups):
                if id(group) not in own:
                    raise ValueError(f"ParamGroupFreezer: parameter group {index} of {name!r} is not one of "
                                     f"the optimiser's parameter groups")

    def freeze(self, collection_name: str) -> None:
        """Give the parameters of ``collection_name`` no updates until :meth:`unfreeze`."""
        self.param_group_collections[collection_name]  # KeyError names an unknown collection
        self.frozen.add(collection_name)

    def unfreeze(self, collection_name: str) -> None:
        """Update the parameters of ``collection_name`` again."""
        self.param_group_collections[collection_name]
        self.frozen.discard(collection_name)

    def frozen_params(self) -> list[torch.nn.Parameter]:
        """The parameters of the frozen collections."""
        return [p for name in sorted(self.frozen) for group in self.param_group_collections[name]
                for p in group["params"]]


def backward_losses(loss_module: Any, losses: Any) -> None:
    """``loss_module.backward(losses)``; without one, backpropagate the sum of the ``loss_*`` terms.

    Raises
    ------
    KeyError
        If the losses hold no differentiable ``loss_*`` entry (names the keys).
    """
    backward = getattr(loss_module, "backward", None)
    if callable(backward):
        backward(losses)
        return
    terms = [value.sum() for key, value in losses.items(include_nested=True, leaves_only=True)
             if (key[-1] if isinstance(key, tuple) else key).startswith("loss_") and value.requires_grad]
    if not terms:
        raise KeyError(f"{type(loss_module).__name__}: the losses hold no differentiable loss_* entry "
                       f"(keys: {list(losses.keys(include_nested=True, leaves_only=True))})")
    torch.stack(terms).sum().backward()


def optimizer_step(optimizer: torch.optim.Optimizer, all_params: list, frozen_params: list, accumulated: int,
                   max_grad_norm: float) -> None:
    """One step on the mean gradient of ``accumulated`` minibatches: the frozen parameters'
    gradients dropped (the optimiser skips parameters without one), clipped to ``max_grad_norm``."""
    for p in frozen_params:
        p.grad = None
    if accumulated > 1:
        for p in all_params:
            if p.grad is not None:
                p.grad.div_(accumulated)
    clip_grad_norm(all_params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def clip_grad_norm(params: list, max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)``, bit-identical, without its per-call Python
    where every gradient is a plain tensor on one CPU or CUDA device in one dtype (the same operations:
    the per-tensor norms in one call, their norm, the clamped coefficient, one scaling call);
    otherwise torch's function itself."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    first = grads[0]
    if first.device.type not in ("cpu", "cuda") or any(
            type(g) is not torch.Tensor or g.device != first.device or g.dtype != first.dtype for g in grads):
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    with torch.no_grad():
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        coefficient = torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0)
        torch._foreach_mul_(grads, coefficient)
