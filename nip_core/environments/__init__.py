"""Environments: the batched TorchRL ``TensorDictEnvironment`` and rollout helpers."""

from nip_core.environments.data_cycler import VariableDataCycler
from nip_core.environments.rollouts import collect_batch
from nip_core.environments.tensordict_env import TensorDictEnvironment, environment_sizes

__all__ = ["TensorDictEnvironment", "VariableDataCycler", "collect_batch", "environment_sizes"]
