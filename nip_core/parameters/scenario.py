"""Scenario, dataset and miscellaneous parameter groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from nip_core.parameters.base import ParamsModel, unsupported_field


_REGISTERED_DATASETS_ONLY = ("the scenario loads a registered dataset (the dataset field) as it is; filter buggy-APPS "
                             "data when registering one (load_dataset's apps_difficulty, exclude_flagged).")


class CodeValidationParameters(ParamsModel):
    """APPS problem selection of the original library (nipflow loads registered datasets)."""

    apps_difficulty: Literal["introductory", "interview", "competition"] = unsupported_field(
        "interview", "APPS difficulty of the code-validation problems.", _REGISTERED_DATASETS_ONLY)
    apps_solution_number: int = unsupported_field(
        0, "Which APPS solution of each problem to use.", _REGISTERED_DATASETS_ONLY, ge=0)
    apps_exclude_flagged: bool = unsupported_field(
        True, "Leave out problems flagged as faulty in buggy APPS.", _REGISTERED_DATASETS_ONLY)


class DatasetParameters(ParamsModel):
    """``dataset_options``: options applied when the dataset is loaded."""

    max_train_size: int | None = Field(
        None, gt=0, description="Keep only the first this many training datapoints (None: all).")
    max_test_size: int | None = Field(None, gt=0, description="Keep only the first this many test "
                                                              "datapoints (None: all).")


_NO_MESSAGE_REGRESSION = "message regression is not implemented."


class MessageRegressionParameters(ParamsModel):
    """Regression of the labels from the agents' messages (original library); not supported."""

    enabled: bool = unsupported_field(
        False, "Fit a regressor from the agents' messages to the labels after testing.", _NO_MESSAGE_REGRESSION)
    agents: list[str] | None = unsupported_field(
        None, "Agents whose messages are regressed (None: all).", _NO_MESSAGE_REGRESSION)
    regression_method: Literal["mlp", "cnn"] = unsupported_field(
        "mlp", "Regressor of the message regression (MLP or CNN).", _NO_MESSAGE_REGRESSION)
    test_size: float = unsupported_field(
        0.2, "Fraction (0 to 1) of the messages held out to test the regressor.", _NO_MESSAGE_REGRESSION,
        gt=0.0, lt=1.0)
    reset_on_fit: bool = unsupported_field(
        True, "Re-initialise the regressor before each fit.", _NO_MESSAGE_REGRESSION)
    mlp_num_layers: int = unsupported_field(2, "Layers of the MLP regressor.", _NO_MESSAGE_REGRESSION, ge=1)
    mlp_hidden_size: int = unsupported_field(
        64, "Hidden width of the MLP regressor.", _NO_MESSAGE_REGRESSION, gt=0)
    mlp_activation: Literal["relu", "tanh", "sigmoid"] = unsupported_field(
        "relu", "Non-linearity of the MLP regressor.", _NO_MESSAGE_REGRESSION)
    mlp_num_epochs: int = unsupported_field(
        10, "Training epochs of the MLP regressor.", _NO_MESSAGE_REGRESSION, gt=0)
    mlp_batch_size: int = unsupported_field(
        512, "Batch size of the MLP regressor.", _NO_MESSAGE_REGRESSION, gt=0)
    mlp_learning_rate: float = unsupported_field(
        0.001, "Learning rate of the MLP regressor.", _NO_MESSAGE_REGRESSION, gt=0.0)
