"""Scenario, dataset and miscellaneous parameter groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from nip_core.parameters.base import ParamsModel


class CodeValidationParameters(ParamsModel):
    apps_difficulty: Literal["introductory", "interview", "competition"] = "interview"
    apps_solution_number: int = Field(0, ge=0)
    apps_exclude_flagged: bool = True


class DatasetParameters(ParamsModel):
    """``dataset_options``: options applied when the dataset is loaded."""

    max_train_size: int | None = Field(None, gt=0)
    max_test_size: int | None = Field(None, gt=0)


class MessageRegressionParameters(ParamsModel):
    enabled: bool = False
    agents: list[str] | None = None
    regression_method: Literal["mlp", "cnn"] = "mlp"
    test_size: float = Field(0.2, gt=0.0, lt=1.0)
    reset_on_fit: bool = True
    mlp_num_layers: int = Field(2, ge=1)
    mlp_hidden_size: int = Field(64, gt=0)
    mlp_activation: Literal["relu", "tanh", "sigmoid"] = "relu"
    mlp_num_epochs: int = Field(10, gt=0)
    mlp_batch_size: int = Field(512, gt=0)
    mlp_learning_rate: float = Field(0.001, gt=0.0)
