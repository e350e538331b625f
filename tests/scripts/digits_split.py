"""scikit-learn's digits, standardised and split 80/20 (stratified), as the test scripts
beside this module train on them."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch.utils.data import TensorDataset


def digits_split(seed: int = 0) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """The training set, and the test split's inputs and labels."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    # Pixels that never vary in the training split get unit scale, not a division by ~0.
    scaler = StandardScaler().fit(x_train)

    def inputs(a: object) -> torch.Tensor:
        return torch.tensor(scaler.transform(a), dtype=torch.float32)

    train = TensorDataset(inputs(x_train), torch.tensor(y_train))
    return train, inputs(x_test), torch.tensor(y_test)
