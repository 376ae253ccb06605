"""Scenario, dataset and miscellaneous parameter groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from nip_core.parameters.base import ParamsModel


class CodeValidationParameters(ParamsModel):
    apps_difficulty: Literal["introductory", "interview", "competition"] = Field(
        "interview", description="APPS difficulty of the code-validation problems; not read by nipflow "
                                 "(kept so that the original library's parameter files load); buggy-APPS "
                                 "files loaded by path filter by it.")
    apps_solution_number: int = Field(0, ge=0, description="Which APPS solution of each problem to use; not "
                                                           "read by nipflow (kept so that the original "
                                                           "library's parameter files load).")
    apps_exclude_flagged: bool = Field(True, description="Leave out problems flagged as faulty in buggy "
                                                         "APPS; not read by nipflow (kept so that the "
                                                         "original library's parameter files load).")


class DatasetParameters(ParamsModel):
    """``dataset_options``: options applied when the dataset is loaded."""

    max_train_size: int | None = Field(
        None, gt=0, description="Keep only the first this many training datapoints (None: all).")
    max_test_size: int | None = Field(None, gt=0, description="Keep only the first this many test "
                                                              "datapoints (None: all).")


class MessageRegressionParameters(ParamsModel):
    enabled: bool = Field(False, description="Fit a regressor from the agents' messages to the labels after "
                                             "testing; not read by nipflow (kept so that the original "
                                             "library's parameter files load).")
    agents: list[str] | None = Field(None, description="Agents whose messages are regressed (None: all); "
                                                       "not read by nipflow (kept so that the original "
                                                       "library's parameter files load).")
    regression_method: Literal["mlp", "cnn"] = Field(
        "mlp", description="Regressor of the message regression (MLP or CNN); not read by nipflow (kept so "
                           "that the original library's parameter files load).")
    test_size: float = Field(0.2, gt=0.0, lt=1.0, description="Fraction (0 to 1) of the messages held out "
                                                              "to test the regressor; not read by nipflow "
                                                              "(kept so that the original library's "
                                                              "parameter files load).")
    reset_on_fit: bool = Field(True, description="Re-initialise the regressor before each fit; not read by "
                                                 "nipflow (kept so that the original library's parameter "
                                                 "files load).")
    mlp_num_layers: int = Field(2, ge=1, description="Layers of the MLP regressor; not read by nipflow "
                                                     "(kept so that the original library's parameter files "
                                                     "load).")
    mlp_hidden_size: int = Field(64, gt=0, description="Hidden width of the MLP regressor; not read by "
                                                       "nipflow (kept so that the original library's "
                                                       "parameter files load).")
    mlp_activation: Literal["relu", "tanh", "sigmoid"] = Field(
        "relu", description="Non-linearity of the MLP regressor; not read by nipflow (kept so that the "
                            "original library's parameter files load).")
    mlp_num_epochs: int = Field(10, gt=0, description="Training epochs of the MLP regressor; not read by "
                                                      "nipflow (kept so that the original library's "
                                                      "parameter files load).")
    mlp_batch_size: int = Field(512, gt=0, description="Batch size of the MLP regressor; not read by "
                                                       "nipflow (kept so that the original library's "
                                                       "parameter files load).")
    mlp_learning_rate: float = Field(
        0.001, gt=0.0, description="Learning rate of the MLP regressor; not read by nipflow (kept so that "
                                   "the original library's parameter files load).")
