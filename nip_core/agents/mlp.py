"""Small building blocks shared by agent parts: activations, MLPs, initialisation."""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}


def activation_class(name: str) -> type[nn.Module]:
    """The ``nn.Module`` class of an ``activation_function`` parameter value."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation_function: unknown activation '{name}' "
                         f"(known: {sorted(ACTIVATIONS)})") from None


def make_mlp(d_in: int, d_hidden: int, d_out: int, num_layers: int, activation: str) -> nn.Sequential:
    """``num_layers`` linear layers (at least 2: first and last always exist) with activations between."""
    act = activation_class(activation)
    layers: list[nn.Module] = [nn.Linear(d_in, d_hidden), act()]
    for _ in range(max(num_layers, 2) - 2):
        layers += [nn.Linear(d_hidden, d_hidden), act()]
    layers.append(nn.Linear(d_hidden, d_out))
    return nn.Sequential(*layers)


def orthogonal_init(module: nn.Module, gain: float = 1.0) -> None:
    """Orthogonal weights and zero biases for every ``nn.Linear`` in ``module``."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            nn.init.orthogonal_(sub.weight, gain=gain)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)


def agent_init_seed(seed: int, agent_index: int) -> int:
    """Seed of an agent's weight initialisation: a pure function of ``(seed, agent_index)``.

    The original used Python's per-process salted ``hash(agent_name)`` (QUIRK 8), so its
    initial weights changed between processes; this one never does.
    """
    return (int(seed) * 1_000_003 + 7919 * (agent_index + 1)) % (2**63 - 1)


def one_hot_round(round_: torch.Tensor, max_rounds: int) -> torch.Tensor:
    """One-hot of the round with ``max_rounds + 1`` classes (float)."""
    return nn.functional.one_hot(round_.long().clamp(0, max_rounds), max_rounds + 1).float()
