"""A regression model whose outputs are (B, 1) against labels (B,) is refused with a clear
message at its first batch, not trained on every output paired with every label (torch's
losses only warn, then broadcast); other warnings pass through as they came."""
from __future__ import annotations

import warnings

import pytest
import torch

import cerebro as cb


def trainable(model: torch.nn.Module, loss=torch.nn.functional.mse_loss) -> cb.TorchTrainable:
    return cb.TorchTrainable(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss=loss,
                             batch_size=4)


def batches(label_shape: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=generator), torch.randn(*label_shape, generator=generator))
            for _ in range(2)]


def test_outputs_of_shape_b_1_against_labels_of_shape_b_are_refused_with_the_fix():
    with pytest.raises(ValueError) as raised:
        trainable(torch.nn.Linear(3, 1)).train_batches(batches((4,)), seed=0, epoch=1)
    message = str(raised.value)
    assert message.startswith("the model's outputs and the labels differ in shape (Using a target size "
                              "(torch.Size([4])) that is different to the input size (torch.Size([4, 1]))")
    assert "model(x).squeeze(-1)" in message and "labels of shape (rows, 1)" in message
    assert "on a batch of features (4, 3) float32 -> outputs (4, 1) float32, labels (4,) float32" in \
        raised.value.__notes__[0]


def test_equal_shapes_train_and_a_models_own_warning_is_given_on():
    class Warns(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            warnings.warn("the model's own warning", UserWarning, stacklevel=1)
            return super().forward(x).squeeze(-1)

    with pytest.warns(UserWarning, match="^the model's own warning$") as caught:
        sums = trainable(Warns(3, 1)).train_batches(batches((4,)), seed=0, epoch=1)
    assert sums.rows == 8 and torch.isfinite(torch.tensor(sums.loss))
    assert len([w for w in caught if "own warning" in str(w.message)]) == 2     # the first batch's is not lost
